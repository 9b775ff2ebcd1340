"""The container images the exports run: servefleet's own (the gateway and sim-server replicas,
built from the repository's Dockerfile) and vLLM's, chosen by GPU generation.

Rule: a GPU of compute capability below 7.5 (Volta: the V100s) gets ``VLLM_IMAGE_VOLTA``, every
newer GPU gets ``VLLM_IMAGE``. Why two (from vLLM's and PyTorch's release notes; not run on a
V100 here):

* vLLM's V1 engine runs on compute capability < 8.0 (fp16; Volta has no bf16) since **v0.10.2**
  ("Extended V1 support to compute capability < 8.0", vllm-project/vllm#23614, #24022); the V0
  engine was removed in v0.11.0. The v0.10.1 image that the exports used before predates it.
* From **v0.20.0** vLLM's images and PyPI wheels are built with CUDA 13.0 and PyTorch 2.11
  (vllm-project/vllm#39878, #34644). CUDA 13 cannot compile for Volta (sm_70), and PyTorch
  2.11 dropped Volta from its CUDA 12.8+ builds (pytorch/pytorch#172352), so no vLLM image
  from v0.20.0 on carries V100 kernels.
* **v0.19.1** is the last release between the two: PyTorch 2.10, CUDA 12.9 as the image's
  default, ``TORCH_CUDA_ARCH_LIST`` with 7.0 — V1 on a V100, from the official image.
* Newer GPUs get v0.26.0, the release measured on the H200 (docs/real-gpu.md). Its CUDA 13
  image needs a driver that supports CUDA 13 (R580 or newer).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from servefleet.hardware import UnknownGPUError, get_gpu

VLLM_IMAGE = "vllm/vllm-openai:v0.26.0"
VLLM_IMAGE_VOLTA = "vllm/vllm-openai:v0.19.1"
FIRST_CC_OF_NEW_IMAGES = (7, 5)
"""CUDA 13 (vLLM >= 0.20) compiles for Turing (7.5) and newer only."""


def servefleet_image() -> str:
    """``servefleet:<version>``: what ``docker build -t servefleet:<version> .`` in this
    repository makes (docs/export.md)."""
    try:
        return f"servefleet:{version('servefleet')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "servefleet:dev"


def vllm_image(gpu: str) -> tuple[str, str]:
    """(image, why) for replicas on ``gpu`` (a catalog name; unknown GPUs get the new image)."""
    try:
        cc = get_gpu(gpu).compute_capability
    except UnknownGPUError:
        return VLLM_IMAGE, f"{gpu} is not in the GPU catalog: assumed Turing or newer"
    if tuple(cc) < FIRST_CC_OF_NEW_IMAGES:
        return VLLM_IMAGE_VOLTA, (
            f"{gpu} is compute capability {cc[0]}.{cc[1]}: vLLM >= 0.20 images (CUDA 13, PyTorch "
            "2.11) have no sm_70 kernels; v0.19.1 is the last with them, and runs the V1 engine "
            "on Volta (since v0.10.2)"
        )
    return VLLM_IMAGE, (
        f"{gpu} is compute capability {cc[0]}.{cc[1]}: the vLLM release measured on the H200 "
        "(docs/real-gpu.md); its CUDA 13 image needs an R580+ driver"
    )
