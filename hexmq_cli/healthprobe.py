"""`hexmq health`: ask a service's /readyz (or /healthz) and exit 0 if it says yes.

The container image's HEALTHCHECK: one command for every service role, since each service
answers on its own metrics port (--metrics-listen, HEXMQ_METRICS_LISTEN in the container's
environment) with its own readiness. The slim image has no curl; this needs only the standard
library, so it starts in a few tens of milliseconds.

    hexmq health                 GET /readyz on $HEXMQ_METRICS_LISTEN (0.0.0.0 -> 127.0.0.1)
    hexmq health --live          GET /healthz instead (the process is up)
    hexmq health --url URL       any URL

Exit codes: 0 the answer was 200, 1 it was not (or no answer), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

from hexmq.netaddr import parse_hostport

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
METRICS_LISTEN = "HEXMQ_METRICS_LISTEN"
# A listener on every address is reached on loopback (the probe runs beside the service).
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def probe_url(metrics_listen: str, path: str) -> str:
    host, port = parse_hostport(metrics_listen, what=METRICS_LISTEN)
    host = _WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def main(argv: list[str], env: Mapping[str, str], prog: str = "hexmq health") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Ask the service on this machine whether it is ready (/readyz) or up "
        "(/healthz); exit 0 if so. The container image's HEALTHCHECK.",
    )
    parser.add_argument("--live", action="store_true", help="ask /healthz instead of /readyz")
    parser.add_argument(
        "--url", help=f"the URL to ask (default: /readyz or /healthz on ${METRICS_LISTEN})"
    )
    parser.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait (default %(default)s)"
    )
    args = parser.parse_args(argv)
    path = "/healthz" if args.live else "/readyz"
    url = args.url
    if url is None:
        listen = env.get(METRICS_LISTEN, "").strip()
        if not listen:
            print(
                f"{prog}: error: give --url, or set {METRICS_LISTEN} (the service's "
                "--metrics-listen)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        try:
            url = probe_url(listen, path)
        except ValueError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            body = response.read(4096).decode(errors="replace").strip()
            print(f"{url}: {response.status} {body}")
            return EXIT_OK if response.status == 200 else EXIT_FAILED
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read(4096).decode(errors="replace").strip()
        print(f"{url}: {exc.code} {body}")
        return EXIT_FAILED
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"{url}: no answer: {reason}")
        return EXIT_FAILED
