"""What a good probe may go on to read: a router-mode host's `GET /models`, and `/props` of the
models whose `parallel`/`ctx` the config leaves unset (registry.py calls it, catalog.py keeps it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from twisted.internet.defer import CancelledError
from twisted.logger import Logger

from crossbar.hosts.health import Prober, failure_reason, model_id_fault
from crossbar.hosts.residency import ModelEvent
from crossbar.wire import printable

if TYPE_CHECKING:
    from crossbar.hosts.entry import HostEntry


async def discover(
    prober: Prober,
    name: str,
    host: HostEntry,
    log: Logger,
    current: Callable[[], bool],
    seen: Callable[[Sequence[ModelEvent]], None],
) -> bool:
    """Read what the host serves into its catalog; True when the catalog took new props (the
    caller then tells who listens for slot changes). `current()` says the host is still the
    one configured: a reload meanwhile voids what was read. A router's loads and unloads seen
    in its listing go to `seen`."""
    catalog, residency = host.catalog, host.residency

    def void() -> bool:
        return not current() or host.catalog is not catalog  # removed or reconfigured

    if residency is not None and not residency.props_read and residency.configured is None:
        try:
            places = await prober.router_places(host.config)
        except CancelledError:
            raise
        except Exception as e:
            why = str(e) if isinstance(e, ValueError) else failure_reason(e)
            log.warn("host {host}: cannot read the router's /props: {why}", host=name, why=why)
        else:
            if void():
                return False
            residency.props, residency.props_read = places, True
    if host.config.discover:
        asked = prober.clock.seconds()
        refused: list[str] = []
        try:
            listed = await prober.list_models(host.config, refused)
        except CancelledError:
            raise
        except Exception as e:
            # What the host listed before stays: a failed read is no news of its models.
            why = str(e) if isinstance(e, ValueError) else failure_reason(e)
            log.warn("host {host}: cannot read /models: {why}", host=name, why=why)
            return False
        if void():
            return False
        if set(refused) != catalog.refused_ids:
            catalog.refused_ids = set(refused)
            for model in refused:
                log.warn(
                    "host {host} lists a model id crossbar refuses ({why}): {model}",
                    host=name,
                    why=model_id_fault(model),
                    model=printable(model),
                )
        if catalog.take_listing(listed):
            log.info(
                "host {host} serves {models}",
                host=name,
                models=", ".join(f"{m} ({state})" for m, state in listed.items()) or "nothing",
            )
        if residency is not None:
            seen(residency.take_listing(listed, asked))
    found, failed = await prober.read_props(host.config, catalog.wanting_props())
    if void():
        return False
    for model, why in failed.items():
        # A router's model may be moving (loaded, then unloaded for another): its /props then
        # fails, which says nothing of the host. Read again at the next probe.
        say = log.info if host.config.discover else log.warn
        say("host {host}: cannot read /props for {model}: {why}", host=name, model=model,
            why=why)  # fmt: skip
    for model, props in found.items():
        log.info(
            "host {host} model {model}: /props says total_slots={slots}, n_ctx={n_ctx}",
            host=name,
            model=model,
            slots=props.total_slots,
            n_ctx=props.n_ctx,
        )
    catalog.take_props(found, failed)
    return True
