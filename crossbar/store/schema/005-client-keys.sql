-- Named client keys (tenants). `client_keys` holds each key's hash of its secret (never the
-- secret), scope, limits and state; every write of it is also a row of `changes` (kind 'key',
-- route = the key's name) that the other instances follow. `key_spend` holds what each
-- instance charged each key per budget period (a UTC day 'd2026-12-01' or month 'm2026-12'),
-- so every instance sees the key's spending in all of them. Usage rows and their sums name
-- the key ('' for none); the sums' primary keys gain it, so they are made again.

CREATE TABLE client_keys (
    name       TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL,            -- of the secret
    old_sha256 TEXT NOT NULL DEFAULT '', -- the secret before a rotation, until old_until
    old_until  {time} NOT NULL DEFAULT 0,
    routes     TEXT NOT NULL,            -- JSON array of names or globs
    models     TEXT NOT NULL,            -- JSON array; [] any
    expires    {time},                   -- NULL: never
    blocked    INTEGER NOT NULL DEFAULT 0,
    limits     TEXT NOT NULL,            -- JSON object (crossbar.config.KeyLimits)
    created    {time} NOT NULL,
    source     TEXT NOT NULL,            -- 'config' or 'api'
    seed       TEXT NOT NULL DEFAULT ''  -- digest of the config entry it was seeded from
) {without_rowid};

CREATE TABLE key_spend (
    key      TEXT NOT NULL,
    period   TEXT NOT NULL,
    instance TEXT NOT NULL,
    spent    {time} NOT NULL,            -- tokens, cached ones at the key's weight
    starts   {time} NOT NULL,            -- the period's start (for pruning)
    PRIMARY KEY (key, period, instance)
) {without_rowid};
CREATE INDEX key_spend_period ON key_spend (period);

ALTER TABLE usage ADD COLUMN key TEXT NOT NULL DEFAULT '';

CREATE TABLE usage_minutes_keyed (
    minute            {time} NOT NULL,
    route             TEXT NOT NULL,
    host              TEXT NOT NULL,
    model             TEXT NOT NULL,
    key               TEXT NOT NULL DEFAULT '',
    requests          BIGINT NOT NULL,
    errors            BIGINT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    PRIMARY KEY (minute, route, host, model, key)
) {without_rowid};
INSERT INTO usage_minutes_keyed (minute, route, host, model, key, requests, errors,
    prompt_tokens, cached_tokens, completion_tokens)
    SELECT minute, route, host, model, '', requests, errors, prompt_tokens, cached_tokens,
    completion_tokens FROM usage_minutes;
DROP TABLE usage_minutes;
ALTER TABLE usage_minutes_keyed RENAME TO usage_minutes;

CREATE TABLE usage_hours_keyed (
    hour              {time} NOT NULL,
    route             TEXT NOT NULL,
    host              TEXT NOT NULL,
    model             TEXT NOT NULL,
    key               TEXT NOT NULL DEFAULT '',
    requests          BIGINT NOT NULL,
    errors            BIGINT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    PRIMARY KEY (hour, route, host, model, key)
) {without_rowid};
INSERT INTO usage_hours_keyed (hour, route, host, model, key, requests, errors,
    prompt_tokens, cached_tokens, completion_tokens)
    SELECT hour, route, host, model, '', requests, errors, prompt_tokens, cached_tokens,
    completion_tokens FROM usage_hours;
DROP TABLE usage_hours;
ALTER TABLE usage_hours_keyed RENAME TO usage_hours;
