"""GPU telemetry: what the GPUs did while a fleet served (utilization, memory, power, SM clock).

* ``nvml``: read the GPUs through NVML (nvidia-ml-py, the ``telemetry`` extra); where NVML is
  missing, ``open_nvml`` returns why, in one line.
* ``exporter``: the Prometheus endpoint ``servefleet up`` serves (engine vllm), with the metric
  names of NVIDIA's DCGM exporter, so ``servefleet bench --gpu-metrics`` reads either.
* ``series``: samples taken during a bench point, as time series and per-point figures (pure).
* ``busy``: the modelled GPU busy fraction over time, from engine step intervals (pure) —
  the simulator's counterpart of measured utilization.
"""
