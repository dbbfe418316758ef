-- The OpenAI Batch API (docs/reference.md, "Batches"). `batch_files` holds uploaded input files
-- and the output and error files crossbar writes (JSONL text: a valid file holds no NUL);
-- `batches` one row per batch, its times in seconds since the epoch (0: not yet);
-- `batch_items` one row per request line, claimed by one instance at a time: `claim` is the
-- claiming instance's token, `not_before` when the claim runs out (running) or when a retry may
-- start (pending). An item's `result` is its output or error line, written once, by the claim
-- that ran it.

CREATE TABLE batch_files (
    id       TEXT PRIMARY KEY,
    route    TEXT NOT NULL,
    key      TEXT NOT NULL DEFAULT '',
    purpose  TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes    BIGINT NOT NULL,
    lines    INTEGER NOT NULL DEFAULT 0,
    created  {time} NOT NULL,
    content  TEXT NOT NULL
);
CREATE INDEX batch_files_route ON batch_files (route, created);

CREATE TABLE batches (
    id                TEXT PRIMARY KEY,
    route             TEXT NOT NULL,
    key               TEXT NOT NULL DEFAULT '',
    endpoint          TEXT NOT NULL,
    input_file_id     TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status            TEXT NOT NULL,
    created           {time} NOT NULL,
    expires_at        {time} NOT NULL,
    in_progress_at    {time} NOT NULL DEFAULT 0,
    finalizing_at     {time} NOT NULL DEFAULT 0,
    completed_at      {time} NOT NULL DEFAULT 0,
    failed_at         {time} NOT NULL DEFAULT 0,
    expired_at        {time} NOT NULL DEFAULT 0,
    cancelling_at     {time} NOT NULL DEFAULT 0,
    cancelled_at      {time} NOT NULL DEFAULT 0,
    output_file_id    TEXT NOT NULL DEFAULT '',
    error_file_id     TEXT NOT NULL DEFAULT '',
    errors            TEXT NOT NULL DEFAULT '',  -- JSON list of {code, message, line}
    metadata          TEXT NOT NULL DEFAULT '',  -- JSON object
    total             INTEGER NOT NULL DEFAULT 0,
    ending            TEXT NOT NULL DEFAULT '',  -- the status it ends in, once decided
    finisher          TEXT NOT NULL DEFAULT '',  -- the instance finalizing it
    finish_until      {time} NOT NULL DEFAULT 0
);
CREATE INDEX batches_status ON batches (status, created);

CREATE TABLE batch_items (
    batch             TEXT NOT NULL,
    line              INTEGER NOT NULL,
    custom_id         TEXT NOT NULL,
    grp               TEXT NOT NULL DEFAULT '',  -- the shared system prompt's digest
    body              TEXT NOT NULL,
    state             TEXT NOT NULL,             -- pending, running, done, failed
    attempts          INTEGER NOT NULL DEFAULT 0,
    claim             TEXT NOT NULL DEFAULT '',
    not_before        {time} NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    cached_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    result            TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (batch, line)
);
-- A batch's items by state in claim order: claims walk it and stop at their limit; "has it
-- ended" reads its prefix.
CREATE INDEX batch_items_state ON batch_items (batch, state, grp, line);
CREATE INDEX batch_items_claim ON batch_items (claim);

-- Every change of a batch's status (and its items' expiry), in the transaction that made it.
CREATE TABLE batch_events (
    id       {id},
    at       {time} NOT NULL,
    batch    TEXT NOT NULL,
    status   TEXT NOT NULL,
    instance TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX batch_events_batch ON batch_events (batch, id);
