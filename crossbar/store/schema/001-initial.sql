-- crossbar's first schema: leases and pins, lease events, usage rows, operator host state.
-- Applied once by crossbar.store_setup (which keeps the version in schema_version); later
-- changes are new numbered files, never edits of this one. The words in braces are filled in
-- per database (crossbar.backends); for SQLite they read as they always have: INTEGER
-- PRIMARY KEY, REAL and WITHOUT ROWID.

CREATE TABLE leases (
    route     TEXT NOT NULL,
    fp        TEXT NOT NULL,            -- "" for a route lease and for a pin row
    model     TEXT NOT NULL,            -- "" only for a pin row
    host      TEXT NOT NULL,
    state     TEXT NOT NULL CHECK (state IN ('active', 'pinned')),
    created   {time} NOT NULL,          -- seconds since the epoch
    last_used {time} NOT NULL,
    PRIMARY KEY (route, fp, model)
) {without_rowid};

CREATE TABLE lease_events (
    id        {id},                     -- insertion order breaks ties between equal times
    at        {time} NOT NULL,
    route     TEXT NOT NULL,
    fp        TEXT NOT NULL,
    model     TEXT NOT NULL,
    from_host TEXT NOT NULL,            -- "" when there is none
    to_host   TEXT NOT NULL,
    reason    TEXT NOT NULL
);
CREATE INDEX lease_events_at ON lease_events (at);
CREATE INDEX lease_events_route_at ON lease_events (route, at);

CREATE TABLE usage (
    id                {id},
    at                {time} NOT NULL,
    route             TEXT NOT NULL,
    fp                TEXT NOT NULL,
    model             TEXT NOT NULL,
    host              TEXT NOT NULL,
    path              TEXT NOT NULL,
    status            INTEGER NOT NULL,
    stream            INTEGER NOT NULL,  -- 0 or 1
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    queue_ms          {time},           -- NULL: not measured (e.g. never queued)
    ttfb_ms           {time},
    duration_ms       {time},
    lease             TEXT NOT NULL DEFAULT '',
    error             TEXT NOT NULL DEFAULT ''
);
CREATE INDEX usage_at ON usage (at);

CREATE TABLE host_state (
    name     TEXT PRIMARY KEY,
    draining INTEGER NOT NULL DEFAULT 0
) {without_rowid};
