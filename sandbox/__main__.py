"""``python -m sandbox --kubeconfig FILE [--port N] [--profile FILE] [--speed X] [--state-file FILE] [--tick-interval S]
[--prometheus-label NAME=VALUE ...] [--prometheus-peer URL ...] [--xid NODE:GPU[:CODE[:AFTER_SECONDS]] ...]``

Starts the sandbox cluster on 127.0.0.1, writes a kubeconfig (context ``sandbox``, bearer token) to FILE, prints
the URL and serves until Ctrl-C or SIGTERM, then saves the state file if one was given.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .app import Sandbox


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox", description="Run the sandbox Kubernetes cluster on loopback.")
    p.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig for this cluster")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: pick a free one)")
    p.add_argument("--profile", default=None, help="cluster profile YAML (nodes); default: the shipped demo profile")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second (default 1)")
    p.add_argument("--state-file", default=None, help="load state from this JSON file at start, save it at stop")
    p.add_argument("--token", default=None, help="bearer token to require (default: a random one)")
    p.add_argument("--tick-interval", type=float, default=0.2,
                   help="seconds between controller rounds (default 0.2); 0 keeps the cluster still: the nodes and "
                        "queues are seeded, objects are stored, and nothing reacts to them")
    p.add_argument("--prometheus-label", action="append", default=[], metavar="NAME=VALUE",
                   help="a label added to every series of this sandbox's Prometheus, e.g. cluster=zone-a (one "
                        "Prometheus over several clusters; docs/measured-use.md)")
    p.add_argument("--prometheus-peer", action="append", default=[], metavar="URL",
                   help="another sandbox's base URL whose DCGM series this one's query API answers with too")
    p.add_argument("--xid", action="append", default=[], metavar="NODE:GPU[:CODE[:AFTER_SECONDS]]",
                   help="a GPU that raises an XID error (default code 79, at once) whatever runs on it, as the "
                        "profile's usage.xid does; make run flags one so the health page has a faulty GPU")
    args = p.parse_args(argv)
    xids = []
    for item in args.xid:
        parts = item.split(":")
        try:
            if len(parts) < 2 or len(parts) > 4 or not parts[0]:
                raise ValueError
            xids.append({"node": parts[0], "gpu": int(parts[1]), "code": int(parts[2]) if len(parts) > 2 else 79,
                         "afterSeconds": float(parts[3]) if len(parts) > 3 else 0.0})
        except ValueError:
            p.error(f"--xid takes NODE:GPU[:CODE[:AFTER_SECONDS]] (GPU and CODE whole numbers), not {item!r}")
    labels = {}
    for item in args.prometheus_label:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--prometheus-label takes NAME=VALUE, not {item!r}")
        labels[name] = value

    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    sb = Sandbox(port=args.port, kubeconfig=args.kubeconfig, profile=args.profile, speed=args.speed,
                 state_file=args.state_file, token=args.token, tick_interval=args.tick_interval)
    if labels:
        sb.dcgm.external_labels.update(labels)
    sb.dcgm.peers.extend(u.rstrip("/") for u in args.prometheus_peer)
    sb.dcgm.xid_faults.extend(xids)
    sb.start()
    print(f"sandbox cluster listening on {sb.url}", flush=True)
    print(f"kubeconfig written to {args.kubeconfig} (context 'sandbox')", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sb.stop()
        print("sandbox cluster stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
