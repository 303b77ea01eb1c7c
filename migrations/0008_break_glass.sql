-- Break-glass kubeconfigs: plain short-lived certificates for when vcp or a tenant's syncer is
-- down. They carry no revocation group, so they cannot be revoked: marked, so the API says so
-- instead of recording a revocation nothing enforces.
ALTER TABLE kubeconfigs ADD COLUMN break_glass BOOLEAN NOT NULL DEFAULT false;
