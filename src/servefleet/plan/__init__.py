"""The capacity planner (`servefleet plan`): from a model, a GPU inventory, a workload and SLOs
to a simulated, explained vLLM fleet configuration. See docs/plan.md.

    from servefleet.plan.planner import PlanRequest, make_plan
    plan = make_plan(PlanRequest(model="Qwen1.5-14B", gpu="V100-SXM2-32G", num_gpus=8))
"""
