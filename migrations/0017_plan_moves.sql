-- A plan change that moves a tenant's data between a dedicated etcd and a shared datastore
-- (or between two datastores) runs as a restore: its keys exported from the plan it leaves
-- (a logical snapshot), the tenant switched to the plan it goes to, its keys imported there.
-- Both NULL for a plain restore.
ALTER TABLE etcd_restores ADD COLUMN from_plan text, ADD COLUMN to_plan text;
ALTER TABLE etcd_restores ADD CONSTRAINT etcd_restores_move_both
  CHECK ((from_plan IS NULL) = (to_plan IS NULL));
