-- Usage at scale: the raw usage rows are kept for server.usage_raw_retention only; before they
-- go, the sweep sums them per minute and (route, host, model) into usage_minutes, and whole
-- hours of those into usage_hours, both kept for server.usage_retention. usage_rollup says how
-- far the sums reach (rolled_until: every raw row before it is in usage_minutes; hours_until:
-- every minute before it is in usage_hours) and from when raw rows are still kept (raw_from).
-- Reports read each stretch of time from one of them, so no request is counted twice.

CREATE TABLE usage_minutes (
    minute            {time} NOT NULL,  -- the minute's start, seconds since the epoch
    route             TEXT NOT NULL,
    host              TEXT NOT NULL,
    model             TEXT NOT NULL,
    requests          BIGINT NOT NULL,
    errors            BIGINT NOT NULL,  -- status >= 400 or an error
    prompt_tokens     BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    PRIMARY KEY (minute, route, host, model)  -- every report reads a range of minutes
) {without_rowid};

CREATE TABLE usage_hours (
    hour              {time} NOT NULL,  -- the hour's start, seconds since the epoch
    route             TEXT NOT NULL,
    host              TEXT NOT NULL,
    model             TEXT NOT NULL,
    requests          BIGINT NOT NULL,
    errors            BIGINT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    PRIMARY KEY (hour, route, host, model)
) {without_rowid};

CREATE TABLE usage_rollup (
    rolled_until {time} NOT NULL,
    hours_until  {time} NOT NULL,
    raw_from     {time} NOT NULL
);
INSERT INTO usage_rollup (rolled_until, hours_until, raw_from) VALUES (0, 0, 0);
