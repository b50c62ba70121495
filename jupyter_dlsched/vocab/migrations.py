"""The ledger's tables, as the migrations that build them: version N of the schema is
what the first N scripts make (``store/ledger.py`` runs those a ledger has not had yet, in
one transaction each, and records the version in ``meta``). A script is only ever added,
never changed: a ledger written by any earlier version opens with a later one."""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # version 1
    """
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE jobs(
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        owner TEXT NOT NULL,
        uid INTEGER NOT NULL,
        origin TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        priority INTEGER NOT NULL,
        gpus REAL NOT NULL,
        gpu_mem INTEGER,
        cpus REAL NOT NULL,
        mem INTEGER NOT NULL,
        deadline REAL,
        time_limit REAL,
        retries INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        preemptible INTEGER NOT NULL DEFAULT 0,
        preemptions INTEGER NOT NULL DEFAULT 0,
        distributed INTEGER NOT NULL DEFAULT 0,
        after TEXT NOT NULL DEFAULT '[]',
        backend TEXT NOT NULL DEFAULT 'local',
        submitted REAL NOT NULL,
        started REAL,
        finished REAL,
        placement TEXT,
        host TEXT,
        supervisor_pid INTEGER,
        job_pid INTEGER,
        lease_expires REAL,
        exit_code INTEGER,
        term_signal INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        preempt_requested INTEGER NOT NULL DEFAULT 0,
        progress TEXT,
        attained REAL NOT NULL DEFAULT 0,
        waiting TEXT,
        position INTEGER,
        env TEXT NOT NULL DEFAULT '{}',
        inline INTEGER NOT NULL DEFAULT 0,
        files TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE blobs(hash TEXT PRIMARY KEY, data BLOB NOT NULL);
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_owner ON jobs(owner);
    CREATE TABLE events(
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL,
        time REAL NOT NULL,
        from_state TEXT,
        to_state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        data TEXT
    );
    CREATE INDEX events_job ON events(job_id);
    CREATE TABLE samples(
        time REAL NOT NULL,
        source TEXT NOT NULL,
        util REAL,
        mem_used INTEGER,
        mem_total INTEGER,
        data TEXT
    );
    CREATE INDEX samples_time ON samples(time);
    """,
    # version 2: what a job used, measured by its supervisor (what `sacct` answers)
    """
    ALTER TABLE jobs ADD COLUMN cpu_time REAL;
    ALTER TABLE jobs ADD COLUMN peak_rss INTEGER;
    ALTER TABLE jobs ADD COLUMN peak_gpu_mem INTEGER;
    CREATE INDEX jobs_finished ON jobs(finished);
    """,
    # version 3: data staged into a node-local cache while a job waits (see staging/)
    """
    ALTER TABLE jobs ADD COLUMN stage_in TEXT NOT NULL DEFAULT '{}';
    CREATE TABLE job_inputs(
        job_id TEXT NOT NULL,
        name TEXT NOT NULL,
        source TEXT NOT NULL,
        source_id TEXT NOT NULL,
        added REAL NOT NULL,
        key TEXT,
        PRIMARY KEY(job_id, name)
    );
    CREATE INDEX job_inputs_source ON job_inputs(source_id);
    CREATE INDEX job_inputs_key ON job_inputs(key);
    CREATE INDEX job_inputs_unstaged ON job_inputs(job_id) WHERE key IS NULL;
    CREATE TABLE stagings(
        source_id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        uid INTEGER NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        stager_pid INTEGER,
        host TEXT,
        lease_expires REAL,
        started REAL,
        done_bytes INTEGER NOT NULL DEFAULT 0,
        total_bytes INTEGER,
        rate REAL,
        note TEXT
    );
    CREATE TABLE cache_entries(
        key TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        path TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        files INTEGER NOT NULL,
        checksum TEXT NOT NULL,
        created REAL NOT NULL,
        last_used REAL NOT NULL,
        hits INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX cache_entries_lru ON cache_entries(last_used);
    """,
    # version 4: what a running job uses now, written by its supervisor every few seconds
    """
    ALTER TABLE jobs ADD COLUMN cpu_now REAL;
    ALTER TABLE jobs ADD COLUMN rss_now INTEGER;
    """,
    # version 5: a payload is deleted a while (DLSCHED_PAYLOAD_KEEP, for a requeue) after
    # no job that can still run names it (unused_since says since when). blob_refs
    # counts the files of unfinished jobs that name each blob (apart from the data, so that
    # counting does not rewrite it) and says whose it is (a quota is one indexed sum);
    # Store.collect_leftovers counts again, as this does for a ledger that kept everything
    """
    CREATE TABLE blob_refs(
        hash TEXT PRIMARY KEY,
        refs INTEGER NOT NULL,
        size INTEGER NOT NULL,
        uid INTEGER,
        unused_since REAL
    ) WITHOUT ROWID;
    CREATE INDEX blob_refs_uid ON blob_refs(uid, size);
    CREATE INDEX blob_refs_unused ON blob_refs(unused_since) WHERE refs <= 0;
    INSERT INTO blob_refs(hash, refs, size, uid)
        SELECT f.value, COUNT(*), 0, MIN(j.uid) FROM jobs j, json_each(j.files) f
        WHERE j.state IN ('queued','running','preempted') GROUP BY f.value;
    UPDATE blob_refs SET size = COALESCE((SELECT length(data) FROM blobs b WHERE b.hash = blob_refs.hash), 0);
    DELETE FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs);
    """,
    # version 6: a job run again (`dlsched requeue`) names the job it re-runs
    """
    ALTER TABLE jobs ADD COLUMN requeue_of TEXT;
    """,
    # version 7: whose a data-cache entry is (a shared pool's per-user cache quota); an
    # entry from before belongs to nobody and counts against no user's quota
    """
    ALTER TABLE cache_entries ADD COLUMN uid INTEGER;
    CREATE INDEX cache_entries_uid ON cache_entries(uid, last_used);
    """,
    # version 8: elastic jobs: the most GPUs one may grow to (``gpus`` is its minimum), and
    # the placement a resize restarts it on once it has stopped
    """
    ALTER TABLE jobs ADD COLUMN max_gpus INTEGER;
    ALTER TABLE jobs ADD COLUMN resize_to TEXT;
    """,
    # version 9: a job may wait for a moment (`--begin`), and schedules submit a job again
    # and again (`--every`): the job each submission copies, the next tick, the last run
    """
    ALTER TABLE jobs ADD COLUMN begin REAL;
    CREATE TABLE schedules(
        id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        owner TEXT NOT NULL,
        every TEXT NOT NULL,
        template TEXT NOT NULL,
        created REAL NOT NULL,
        next_run REAL NOT NULL,
        last_job TEXT,
        runs INTEGER NOT NULL DEFAULT 0,
        skipped INTEGER NOT NULL DEFAULT 0
    );
    """,
    # version 10: when a waiting job should start (epoch seconds), expected and a P80 bound,
    # from the forecast of the decision that last placed it in line
    """
    ALTER TABLE jobs ADD COLUMN expected_start REAL;
    ALTER TABLE jobs ADD COLUMN start_p80 REAL;
    """,
    # version 11: a waiting job's `position` is its rank in its backend's line (numbers that
    # increase along it, not necessarily 1, 2, 3: a start rewrites no other job's), numbered
    # 1..n when read (store/job_reads.py); the line in rank order, to number it
    """
    CREATE INDEX jobs_line ON jobs(backend, position, seq)
        WHERE position IS NOT NULL AND state IN ('queued','preempted');
    """,
    # version 12: a job whose result is recorded while its process still exits keeps its
    # lease until its supervisor releases it (``HELD_GRANT``): its GPUs stay taken; the
    # few such jobs, found without reading every finished one
    # (an earlier follower's renewal could leave a lease on a finished job: none is held)
    """
    UPDATE jobs SET lease_expires=NULL
        WHERE state IN ('succeeded','failed','cancelled','timeout','lost');
    CREATE INDEX jobs_held ON jobs(backend, seq)
        WHERE state='succeeded' AND lease_expires IS NOT NULL;
    """,
    # version 13: the time a job ran over every attempt (a retried, preempted or resized
    # job ran several times; `started` is its last run's). Known for a finished rigid GPU
    # job (GPU-seconds over GPUs); for any other only its last run's length was kept
    """
    ALTER TABLE jobs ADD COLUMN run_time REAL;
    UPDATE jobs SET run_time = CASE
        WHEN gpus > 0 AND max_gpus IS NULL AND attained > 0 THEN attained / gpus
        ELSE MAX(0, finished - started) END
        WHERE finished IS NOT NULL AND started IS NOT NULL;
    """,
    # version 14: the bytes a job carried in (its pickle, context and big buffers' files)
    # and the bytes of the result it left, shown by `dlsched history` (NULL: not known)
    """
    ALTER TABLE jobs ADD COLUMN input_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN result_bytes INTEGER;
    """,
    # version 15: the size an elastic job waits in line at (``gpus="1:2:4"``), when above its
    # minimum (``gpus``); NULL: it waits at its minimum, as before
    """
    ALTER TABLE jobs ADD COLUMN asked_gpus INTEGER;
    """,
]

#: The version a ledger has once every migration ran.
SCHEMA_VERSION = len(MIGRATIONS)
