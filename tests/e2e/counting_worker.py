"""A real `Worker` process over FakeBackend.counting (tests/fake_backend.py): token i of a request is
its position in the sequence, so a client can check a resumed stream token by token. Started by
tests/e2e/test_cluster_link_cut.py (inside a network namespace), never by hand:

    python tests/e2e/counting_worker.py --broker URL --broker-password-file FILE --model-id ID
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fake_backend

from fake_backend import FakeBackend

from outpost.cluster.broker.connection import broker_url
from outpost.cluster.worker.main import serve_worker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--broker", required=True)
    p.add_argument("--broker-password-file", required=True)
    p.add_argument("--model-id", required=True)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--step-s", type=float, default=0.1, help="seconds per token")
    p.add_argument("--worker-id")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    engine = FakeBackend.counting(slots=args.slots, step_s=args.step_s)
    url = broker_url(args.broker, args.broker_password_file)
    raise SystemExit(asyncio.run(serve_worker(url, args.model_id, engine, args.worker_id)))


if __name__ == "__main__":
    main()
