-- A batch's items by state and their tokens, kept on the batch when it ends (JSON of
-- crossbar.store.Counts): its items no longer change, and reading an ended batch no longer
-- counts them. '' while it runs, and for a batch that failed its checks (it has none).

ALTER TABLE batches ADD COLUMN counts TEXT NOT NULL DEFAULT '';
