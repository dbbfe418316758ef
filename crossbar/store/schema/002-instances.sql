-- Several crossbar instances on one store. Every change an instance makes to leases, pins or
-- draining is also a row of `changes`, numbered by `change_counter` inside the writing
-- transaction (so numbers follow commit order), which the others read from the last number
-- they saw. `instances` holds each live instance's heartbeat (the database's clock).

CREATE TABLE changes (
    id        BIGINT PRIMARY KEY,
    instance  TEXT NOT NULL,
    kind      TEXT NOT NULL,            -- 'lease' (pins are lease rows) or 'drain'
    route     TEXT NOT NULL,            -- for 'drain': the host's name
    fp        TEXT NOT NULL,
    model     TEXT NOT NULL,
    host      TEXT NOT NULL,            -- "" when the row was deleted, or the host undrained
    state     TEXT NOT NULL,            -- the lease row's state; 'draining' or ""
    created   {time} NOT NULL,
    last_used {time} NOT NULL,
    at        {time} NOT NULL           -- when it was written (for pruning)
);
CREATE INDEX changes_at ON changes (at);

CREATE TABLE change_counter (n BIGINT NOT NULL);
INSERT INTO change_counter (n) VALUES (0);

CREATE TABLE instances (
    id        TEXT PRIMARY KEY,
    address   TEXT NOT NULL,            -- its proxy listener
    version   TEXT NOT NULL,
    digest    TEXT NOT NULL,            -- of the config parts that must agree between instances
    started   {time} NOT NULL,
    heartbeat {time} NOT NULL,          -- the database's clock
    in_flight INTEGER NOT NULL DEFAULT 0
);
