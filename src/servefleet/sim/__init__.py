"""The virtual world: engines under a simulated clock behind a router."""
