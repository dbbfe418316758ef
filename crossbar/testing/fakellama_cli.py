"""`crossbar-fakellama`: run the fake llama-server until SIGINT/SIGTERM.

    crossbar-fakellama --port 9001 --model qwen-coder --parallel 2 --tokens-per-second 40

Prints one line with its URL once it listens (`--port 0` picks a free port; the line says
which). Faults can be set at start with flags and later with `POST /_fake/faults`, on the main
port or, with `--control-port`, on a port of its own that stays open while `refuse` is on.

    crossbar-fakellama --router --model qwen --model gemma --loaded qwen

runs it in router mode instead (fakerouter.py): each model a server of its own with the knobs
given, loaded on its first request (`--load-delay` seconds), listed by `GET /models`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attrs import evolve
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from crossbar.testing.fakellama import FakeConfig, FakeLlama, Faults
from crossbar.testing.fakerouter import FakeRouter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crossbar-fakellama",
        description="A fake llama.cpp llama-server for tests, demos and benchmarks.",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port)")
    p.add_argument(
        "--control-port",
        type=int,
        metavar="PORT",
        help="also serve /_fake/* on this port (0: any free one); it stays open under --refuse",
    )
    p.add_argument(
        "--model", action="append", dest="models", metavar="NAME", help="model name (repeatable)"
    )
    p.add_argument("--parallel", type=int, default=2, help="request slots")
    p.add_argument("--ctx", type=int, default=4096, help="context tokens per slot")
    p.add_argument("--tokens-per-second", type=float, default=0, help="0: as fast as possible")
    p.add_argument("--prefill-ms-per-token", type=float, default=0, help="cost of uncached tokens")
    p.add_argument("--cache-slots", type=int, default=4, help="idle prompt caches kept (LRU)")
    p.add_argument("--load-delay", type=float, default=0, help="seconds of 503 Loading model")
    p.add_argument("--reply-tokens", type=int, default=16, help="reply length without max_tokens")
    p.add_argument("--eos-after", type=int, metavar="N", help="end every reply after N tokens")
    p.add_argument("--no-prefill-assistant", action="store_true",
                   help="answer a chat's trailing assistant message as a finished turn, not "
                   "continue it (llama-server's flag)")  # fmt: skip
    p.add_argument(
        "--api-key", default="", metavar="KEY", help="as llama-server's: 401 without it but /health"
    )
    router = p.add_argument_group("router mode (llama-server without -m: models loaded on demand)")
    router.add_argument("--router", action="store_true", help="serve the --model names as a router")
    router.add_argument("--loaded", action="append", default=[], metavar="NAME",
                        help="a model loaded from the start (repeatable)")  # fmt: skip
    router.add_argument("--models-max", type=int, default=0, metavar="N",
                        help="models running at once, the least recently used idle one unloaded "
                        "for a load (0: no limit; llama-server's own default is 4)")  # fmt: skip
    router.add_argument("--unload-delay", type=float, default=0, metavar="SECONDS",
                        help="how long a model's server takes to stop")  # fmt: skip
    router.add_argument("--swap-errors", action="store_true",
                        help="a request meeting a model being stopped gets the router's 500 "
                        "proxy error, as llama-server's does in that race")  # fmt: skip
    faults = p.add_argument_group("faults (also settable at run time: POST /_fake/faults)")
    faults.add_argument("--refuse", action="store_true", help="refuse connections")
    faults.add_argument("--error-500", action="store_true", help="answer 500 to inference")
    faults.add_argument("--hang", action="store_true", help="accept inference, never answer")
    faults.add_argument("--drop-after-chunks", type=int, metavar="N", help="cut streams after N")
    faults.add_argument("--reset-after-chunks", type=int, metavar="N",
                        help="reset streams (TCP RST) after N")  # fmt: skip
    faults.add_argument("--stall-after-chunks", type=int, metavar="N", help="stall streams at N")
    faults.add_argument("--loading", action="store_true", help="stay in 503 Loading model")
    return p


def _config(args: argparse.Namespace) -> tuple[FakeConfig, Faults]:
    config = FakeConfig(
        models=args.models or ["qwen-coder"],
        parallel=args.parallel,
        ctx=args.ctx,
        tokens_per_second=args.tokens_per_second,
        prefill_ms_per_token=args.prefill_ms_per_token,
        cache_slots=args.cache_slots,
        load_delay=args.load_delay,
        reply_tokens=args.reply_tokens,
        eos_after=args.eos_after,
        prefill_assistant=not args.no_prefill_assistant,
        api_key=args.api_key,
    )
    faults = Faults(
        refuse=args.refuse,
        error_500=args.error_500,
        hang=args.hang,
        drop_after_chunks=args.drop_after_chunks,
        reset_after_chunks=args.reset_after_chunks,
        stall_after_chunks=args.stall_after_chunks,
        loading=args.loading,
    )
    return config, faults


async def _route(reactor: Any, config: FakeConfig, args: argparse.Namespace) -> None:
    models = {name: evolve(config, models=[name], load_delay=0) for name in config.models}
    router = FakeRouter(
        reactor,
        models,
        loaded=tuple(args.loaded),
        load_delay=config.load_delay,
        api_key=config.api_key,
        models_max=args.models_max,
        unload_delay=args.unload_delay,
        swap_errors=args.swap_errors,
    )
    await router.start(args.port, args.host)
    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: Deferred.fromCoroutine(router.stop())
    )
    print(f"crossbar-fakellama: router of {', '.join(config.models)} at {router.url}", flush=True)
    await Deferred()  # until the reactor stops


async def _serve(
    reactor: Any, config: FakeConfig, faults: Faults, host: str, port: int, control: int | None
) -> None:
    fake = FakeLlama(reactor, config)
    fake.faults.update(faults.as_dict())
    await fake.start(port, host, control_port=control)
    # The reactor's own SIGINT/SIGTERM handlers stop it; this trigger lets the fake close its
    # connections first, so the process exits 0.
    reactor.addSystemEventTrigger("before", "shutdown", lambda: Deferred.fromCoroutine(fake.stop()))
    control = f" (control {fake.control_url})" if fake.control_url else ""
    print(f"crossbar-fakellama: {', '.join(config.models)} at {fake.url}{control}", flush=True)
    await Deferred()  # until the reactor stops


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `crossbar-fakellama` command; runs until SIGINT/SIGTERM."""
    args = build_parser().parse_args(argv)
    try:
        config, faults = _config(args)
        if args.router and faults != Faults():
            raise ValueError("fault switches apply to a single-model fake, not to --router")
        unknown = sorted(set(args.loaded) - set(config.models))
        if unknown:
            raise ValueError(f"--loaded names no --model: {', '.join(unknown)}")
        router_only = args.models_max or args.unload_delay or args.swap_errors
        if router_only and not args.router:
            raise ValueError("--models-max, --unload-delay and --swap-errors need --router")
        if args.models_max < 0 or args.unload_delay < 0:
            raise ValueError("--models-max and --unload-delay must be at least 0")
        if args.models_max and len(args.loaded) > args.models_max:
            raise ValueError(f"--loaded names more models than --models-max {args.models_max}")
    except ValueError as e:
        print(f"crossbar-fakellama: {e}", file=sys.stderr)
        return 2
    if args.router:
        react(_route, (config, args))  # exits the process
        return 0
    react(_serve, (config, faults, args.host, args.port, args.control_port))  # exits the process
    return 0


if __name__ == "__main__":
    sys.exit(main())
