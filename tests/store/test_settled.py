"""Rows kept for reports are bounded: by queries and by rows in all, the least recently used
going first, and a result too big to be worth keeping is not kept."""

import sqlite3

from crossbar.store.settled import SettledRows


def cursor():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    return conn.cursor()


def test_a_kept_query_is_answered_from_memory_until_cleared():
    cur, kept = cursor(), SettledRows()
    sql = "SELECT n FROM t WHERE n < ?"
    assert kept.fetch(cur, sql, (3,)) == [(0,), (1,), (2,)]
    cur.execute("DELETE FROM t")
    assert kept.fetch(cur, sql, (3,)) == [(0,), (1,), (2,)] and kept.hits == 1
    kept.clear()
    assert kept.fetch(cur, sql, (3,)) == []


def test_the_least_recently_used_go_first_beyond_the_query_bound():
    cur, kept = cursor(), SettledRows(size=3)
    sql = "SELECT n FROM t WHERE n < ?"
    for bound in (1, 2, 3):
        kept.fetch(cur, sql, (bound,))
    kept.fetch(cur, sql, (1,))  # used again: (2,) is now the least recent
    kept.fetch(cur, sql, (4,))  # a fourth query: (2,) goes
    assert [args for _, args in kept._rows] == [(3,), (1,), (4,)]


def test_rows_in_all_are_bounded_and_a_big_answer_is_not_kept():
    cur, kept = cursor(), SettledRows(size=100, max_rows=40)
    sql = "SELECT n FROM t WHERE n < ?"
    for bound in (10, 9, 8, 7, 6):  # 40 rows in all: every one kept
        kept.fetch(cur, sql, (bound,))
    assert kept._held == 40
    kept.fetch(cur, sql, (5,))  # 45 rows: the oldest query's 10 go
    assert [args for _, args in kept._rows] == [(9,), (8,), (7,), (6,), (5,)]
    assert kept._held == 35
    assert len(kept.fetch(cur, sql, (11,))) == 11  # over a quarter of the bound: not kept
    assert (11,) not in [args for _, args in kept._rows] and kept._held == 35


def test_a_new_floor_empties_what_was_kept_and_the_same_floor_keeps_it():
    cur, kept = cursor(), SettledRows()
    sql = "SELECT n FROM t WHERE n < ?"
    kept.floor((60.0, 3600.0))
    kept.fetch(cur, sql, (3,))
    kept.floor((60.0, 3600.0))  # nothing pruned: still kept
    assert kept.fetch(cur, sql, (3,)) == [(0,), (1,), (2,)] and kept.hits == 1
    cur.execute("DELETE FROM t WHERE n < 1")
    kept.floor((120.0, 3600.0))  # some instance pruned the oldest minute
    assert kept.fetch(cur, sql, (3,)) == [(1,), (2,)]
