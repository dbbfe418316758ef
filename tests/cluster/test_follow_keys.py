"""The follower reads again the keys another instance changed (its change-log rows of kind
'key'), once per run for any number of rows, and again next run when the store could not
be read; its own rows it skips."""

from __future__ import annotations

from attrs import define, field

from crossbar.cluster import Follower
from crossbar.store import ChangeRow, StoreError
from tests.support.lease_fakes import run_now


def key_row(n: int, name: str, instance: str = "other") -> ChangeRow:
    return ChangeRow(n, instance, "key", name, "", "", "", "", 0.0, 0.0)


@define
class Log:
    rows: list[ChangeRow] = field(factory=list)

    async def changes_since(self, after: int, limit: int = 1000) -> list[ChangeRow]:
        return [r for r in self.rows if r.id > after][:limit]

    async def last_change(self) -> int:
        return self.rows[-1].id if self.rows else 0

    async def list_leases(self) -> list:
        return []

    async def list_draining(self) -> set[str]:
        return set()


@define
class Keys:
    refreshed: list[set[str]] = field(factory=list)
    fail: bool = False
    resyncs: int = 0

    async def refresh(self, names: set[str]) -> None:
        if self.fail:
            raise StoreError("injected")
        self.refreshed.append(set(names))

    async def resync(self) -> None:
        self.resyncs += 1


class Memory:
    def apply_remote(self, lease, key, n) -> None:
        raise AssertionError("no lease rows here")

    def caught_up(self, n: int) -> None:
        pass

    def replace_all(self, leases: list) -> None:
        pass


class Hosts:
    def remote_draining(self, name: str, draining: bool) -> None:
        pass

    def replace_draining(self, names: set[str]) -> None:
        pass


def test_the_keys_other_instances_changed_are_read_again_once_each_run():
    log, keys = Log(), Keys()
    follower = Follower(log, Memory(), Hosts(), "me", 0, keys)
    log.rows += [key_row(1, "dev"), key_row(2, "dev"), key_row(3, "ci"), key_row(4, "me", "me")]
    assert run_now(follower.run()) == 3
    assert keys.refreshed == [{"dev", "ci"}]  # its own row (4) skipped
    assert run_now(follower.run()) == 0 and keys.refreshed == [{"dev", "ci"}]


def test_a_store_that_cannot_be_read_leaves_the_keys_to_read_next_run():
    log, keys = Log(), Keys(fail=True)
    follower = Follower(log, Memory(), Hosts(), "me", 0, keys)
    log.rows.append(key_row(1, "dev"))
    run_now(follower.run())
    assert keys.refreshed == [] and follower.seen == 1
    keys.fail = False
    run_now(follower.run())
    assert keys.refreshed == [{"dev"}]


def test_a_pruned_change_log_reads_every_key_again():
    log, keys = Log([key_row(5, "dev")]), Keys()
    follower = Follower(log, Memory(), Hosts(), "me", 1, keys)  # it saw 1; 2-4 are gone
    run_now(follower.run())
    assert keys.resyncs == 1 and follower.seen == 5
