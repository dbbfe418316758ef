-- Each instance's requests in flight per (host, model), written with its heartbeat, so an
-- instance coming back from a freeze (or taking over a share) never counts on slots another
-- instance still holds: a JSON object {"host\tmodel": n} of the pairs with requests in flight.

ALTER TABLE instances ADD COLUMN slots TEXT NOT NULL DEFAULT '';
