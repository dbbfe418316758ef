-- Times each request's answer moved to another host and went on there (a cut stream
-- continued, an answer that showed nothing run again: docs/reference.md, "Answers that survive
-- their host"); 0 for rows written before.

ALTER TABLE usage ADD COLUMN resumed INTEGER NOT NULL DEFAULT 0;
