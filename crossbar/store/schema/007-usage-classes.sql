-- The request class each request ran at (interactive, standard, batch: docs/reference.md,
-- "Slots": classes); '' for a request that is not inference, and for rows written before.

ALTER TABLE usage ADD COLUMN request_class TEXT NOT NULL DEFAULT '';
