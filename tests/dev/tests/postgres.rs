//! The ephemeral Postgres: a real server from Debian's binaries, gone without a trace on drop.

use sqlx::Connection;
use std::time::Duration;
use vcp_dev::EphemeralPostgres;
use vcp_dev::process::{group_members, pid_alive};

#[tokio::test]
async fn postgres_accepts_a_connection_and_runs_a_migration() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let url = pg.create_database("migrations_test").await?;
    let migrations = tempfile::tempdir()?;
    std::fs::write(
        migrations.path().join("0001_greetings.sql"),
        "CREATE TABLE greetings (id serial PRIMARY KEY, text text NOT NULL);\n\
         INSERT INTO greetings (text) VALUES ('hello');\n",
    )?;
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    let migrator = sqlx::migrate::Migrator::new(migrations.path()).await?;
    migrator.run(&mut conn).await?;
    migrator.run(&mut conn).await?; // a second run applies nothing
    let text: String = sqlx::query_scalar("SELECT text FROM greetings")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(text, "hello");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(applied, 1);
    Ok(())
}

#[tokio::test]
async fn durability_is_off_for_speed() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let mut conn = sqlx::PgConnection::connect(pg.url()).await?;
    for (setting, want) in [
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("listen_addresses", "127.0.0.1"),
    ] {
        let got: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(&mut conn)
            .await?;
        assert_eq!(got, want, "{setting}");
    }
    Ok(())
}

#[tokio::test]
async fn dropping_postgres_stops_it_and_removes_its_directory() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let (pid, dir) = (pg.pid(), pg.dir().to_owned());
    let mut conn = sqlx::PgConnection::connect(pg.url()).await?;
    sqlx::query("SELECT 1").execute(&mut conn).await?;
    assert!(pid_alive(pid) && dir.join("data/PG_VERSION").exists());
    drop(pg);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !pid_alive(pid) && group_members(pid).is_empty(),
        "postgres outlived its handle"
    );
    assert!(!dir.exists(), "{} outlived its handle", dir.display());
    Ok(())
}

#[tokio::test]
async fn invalid_database_names_are_refused() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    for bad in [
        "",
        "Robert'); DROP TABLE students;--",
        "UPPER",
        &"x".repeat(64),
    ] {
        let err = pg.create_database(bad).await.unwrap_err().to_string();
        assert!(err.contains("[a-z0-9_]"), "{bad}: {err}");
    }
    Ok(())
}
