-- A request a fallback route served (a route's `fallbacks`) is recorded under that route, with
-- the route it came for and why that one could not serve it ('' for a request its own route
-- served).

ALTER TABLE usage ADD COLUMN fallback_from TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN fallback_reason TEXT NOT NULL DEFAULT '';
