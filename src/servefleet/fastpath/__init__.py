"""The fleet simulator's fast path: ``engine``'s rule (vLLM V1's scheduler, KV cache manager and
block pool), with the same results and far less work per step.

* **Lazy decodes** (``cruise``): a request in a steady decode is not touched from step to step;
  its counters are kept as of a step and brought up to date at its next event (a block fills,
  it finishes) or when the scheduler needs them.
* **Blocks no other request can see** (``private_output``, ``contract``): cached late, in one
  run, or never.
* **A blocked queue head** (``kv_cache_manager.still_blocked``): not tried again while nothing
  that could let it in has changed.
* **Blank blocks counted, not named** (``block_pool``).
* **Quiet steps** (``engine.FastEngine.quiet_durations``): steps with nothing but steady
  decodes, which the event loop runs as one event (``sim.cluster.QuietRun``).
* **A compiled core**: these modules, the event loop and the cost model are compiled by mypyc
  at install (``servefleet.compiled``).

``sim.replicas`` is the one seam: ``ClusterSim`` drives either engine through it.
``tests/test_scheduler_lazy.py`` runs the fast scheduler against the plain one step by step,
and ``benchmarks/sim_equivalence.py`` whole simulations both ways.
"""

from servefleet.fastpath.contract import ContentContractError, OwnContent
from servefleet.fastpath.engine import FastEngine

__all__ = ["ContentContractError", "FastEngine", "OwnContent"]
