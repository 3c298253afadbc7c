-- Waiters in other processes wake when a lease is freed instead of polling: every statement
-- that clears a row's owner (release, publish and release, an epoch bump, through the bare
-- statements or the SECURITY DEFINER routines alike) sends a notification on the channel
-- fenced_release whose payload is the schema and the resource, separated by a newline. It
-- is a hint: a waiter still acquires with the conditional statement. NOTIFY is delivered at
-- commit, so a waiter never sees it before the row is free.
CREATE FUNCTION fenced_notify_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fenced_release', TG_TABLE_SCHEMA || E'\n' || NEW.resource);
    RETURN NULL;
END
$$;

CREATE TRIGGER fenced_release_notify
    AFTER UPDATE OF lease_owner ON fenced_resources
    FOR EACH ROW
    WHEN (OLD.lease_owner IS NOT NULL AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION fenced_notify_release();
