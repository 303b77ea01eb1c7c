-- Tenant names are unique per owner, not across the platform: with one global name space, an
-- owner creating a name another owner holds was told it exists (409) while every other route
-- answers 404 for another owner's tenant. Each owner now has its own name space, so nobody
-- learns of another owner's tenants. Host objects never depended on the name being unique:
-- they are named after the tenant key, which carries a random suffix (0001).
DROP INDEX tenants_live_name;
-- A name is unique among one owner's live tenants; a deleted tenant's name can be reused.
CREATE UNIQUE INDEX tenants_live_owner_name ON tenants (owner, name) WHERE deleted_at IS NULL;
-- Admins look tenants up by name alone (every owner's), which the index above cannot serve.
CREATE INDEX tenants_live_name_lookup ON tenants (name) WHERE deleted_at IS NULL;
