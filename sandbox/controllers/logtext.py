"""What a simulated container writes to its log: plausible lines for the portal's three kinds of workload.

The kubelet (``workloads.Kubelet``) asks for the lines of a pod when it starts, every ``LOG_EVERY_SECONDS`` of
simulated time while it runs (a "progress" line) and when it ends. The kind comes from the pod's
``gpuportal.dev/kind`` label (``notebook``, ``training``, ``inference``; set by the portal); a pod without it gets
the generic ``sandbox:`` lines. Every line is stored with the simulated time in front (``common.Context.log``), which
the API server's ``log`` endpoint serves as the runtime's timestamp (``timestamps=true``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

KIND_LABEL = "gpuportal.dev/kind"
# Every progress line carries one of these (the kubelet counts them to know which line is due next).
PROGRESS_MARKERS = (" step ", "Saving file at ", "Avg prompt throughput")


def kind_of(pod: dict) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(KIND_LABEL) or "")


def is_progress(line: str) -> bool:
    return any(marker in line for marker in PROGRESS_MARKERS)


def _jupyter(at: datetime, text: str, level: str = "I", app: str = "ServerApp") -> str:
    return f"[{level} {at.strftime('%Y-%m-%d %H:%M:%S')}.{at.microsecond // 1000:03d} {app}] {text}"


def _vllm(at: datetime, source: str, text: str, level: str = "INFO") -> str:
    return f"{level} {at.strftime('%m-%d %H:%M:%S')} [{source}] {text}"


def _train(at: datetime, text: str, level: str = "INFO") -> str:
    return f"{at.strftime('%Y-%m-%d %H:%M:%S')},{at.microsecond // 1000:03d} {level} train.py: {text}"


def start_lines(pod: dict, node: str, gpus: str, duration: float | None, at: datetime) -> list[str]:
    kind = kind_of(pod)
    name = pod["metadata"]["name"]
    if kind == "notebook":
        base = next((a.split("=", 1)[1] for c in (pod.get("spec") or {}).get("containers") or []
                     for a in c.get("command") or [] if a.startswith("--ServerApp.base_url=")), "/")
        return [
            _jupyter(at, "Extension package jupyterlab took 0.0412s to import"),
            _jupyter(at, "jupyter_lsp | extension was successfully loaded."),
            _jupyter(at, "jupyterlab | extension was successfully loaded."),
            _jupyter(at, "Serving notebooks from local directory: /home/jovyan"),
            _jupyter(at, "Jupyter Server 2.14.2 is running at:"),
            _jupyter(at, f"http://{name}:8888{base}lab?token=..."),
            _jupyter(at, "Use Control-C to stop this server and shut down all kernels (twice to skip confirmation)."),
        ] + ([_jupyter(at, f"GPUs visible to kernels: {gpus}")] if gpus else [])
    if kind == "inference":
        return [
            _vllm(at, "api_server.py:1351", "vLLM API server version 0.12.0"),
            _vllm(at, "model.py:1520", "Using max model len 8192"),
            _vllm(at, "gpu_model_runner.py:1840", f"Starting to load model on {gpus or 'cpu'}..."),
            _vllm(at, "default_loader.py:268", "Loading weights took 14.21 seconds"),
            _vllm(at, "gpu_worker.py:276", "Available KV cache memory: 52.37 GiB"),
            _vllm(at, "api_server.py:1392", "Starting vLLM API server 0 on http://0.0.0.0:8000"),
            _vllm(at, "launcher.py:29", "Available routes are: /health, /v1/models, /v1/chat/completions, /v1/completions"),
            "INFO:     Application startup complete.",
        ]
    if kind == "training":
        return [
            _train(at, f"started on node {node}; world size 1, rank 0"),
            _train(at, f"devices: {gpus or 'cpu only'}"),
            _train(at, "dataset: 1281167 training samples, 50000 validation samples, batch size 256"),
            _train(at, "planned run time " + (f"{duration:.0f}s" if duration is not None else "unbounded")),
        ]
    return [
        f"INFO sandbox: container started on node {node}",
        *([f"INFO sandbox: visible GPU resources {gpus}"] if gpus else []),
        "INFO sandbox: simulated run time " + (f"{duration:.0f}s" if duration is not None else "unbounded"),
    ]


def progress_line(pod: dict, k: int, duration: float | None, every: float, at: datetime) -> str:
    """The ``k``-th progress line (1, 2, ...)."""
    kind = kind_of(pod)
    pct = f", {min(100, int(k * every * 100 / duration))}% done" if duration else ""
    if kind == "notebook":
        return _jupyter(at, f"Saving file at /analysis-{(k - 1) // 10 + 1}.ipynb")
    if kind == "inference":
        digest = int(hashlib.sha1(f"{pod['metadata']['name']}:{k}".encode()).hexdigest()[:6], 16)
        prompt, gen, running = 200 + digest % 900, 40 + digest % 160, digest % 5
        return _vllm(at, "loggers.py:123", f"Engine 000: Avg prompt throughput: {prompt}.0 tokens/s, Avg generation "
                                           f"throughput: {gen}.0 tokens/s, Running: {running} reqs, Waiting: 0 reqs, "
                                           f"GPU KV cache usage: {running * 1.7:.1f}%, Prefix cache hit rate: 41.0%")
    loss = f"{max(0.05, 2.5 / (1 + k * 0.1)):.4f}"
    if kind == "training":
        return _train(at, f"epoch {(k - 1) // 10 + 1} step {k * 100}: loss={loss} lr=3.0e-04 "
                          f"throughput={780 + (k * 37) % 90}.4 samples/s{pct}")
    return f"INFO step {k * 100}: loss={loss}{pct}"


def end_line(pod: dict, failed: bool, at: datetime) -> str:
    kind = kind_of(pod)
    if kind == "training":
        if failed:
            return _train(at, "RuntimeError: CUDA error: an illegal memory access was encountered; exiting with code 1",
                          "ERROR")
        return _train(at, "training finished; checkpoint saved to /data/checkpoints/final.pt; exiting with code 0")
    if kind == "notebook":
        return _jupyter(at, "Shutting down 1 kernel" if not failed else "Kernel died unexpectedly; exiting with code 1")
    if kind == "inference":
        return _vllm(at, "launcher.py:80", "Shutting down FastAPI HTTP server." if not failed
                     else "Engine core died unexpectedly; exiting with code 1", "INFO" if not failed else "ERROR")
    if failed:
        return "ERROR sandbox: simulated failure, exiting with code 1"
    return "INFO sandbox: work finished, exiting with code 0"
