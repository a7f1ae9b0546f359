-- depends: 0015.app-versions

-- Fair claiming (issue 34) takes a fair topic's keys in weighted round robin from a cursor
-- instead of start-time fair queuing: the cursor is the whole state, one row per topic,
-- read and written by the topic's claims under its claim lock (lock_topic), so the claims
-- of every host are one sequence of turns. A claim walks the keys from the cursor, never
-- every key with ready jobs (docs/architecture.md, "Fair claiming"). The turns of 0015 are
-- dropped: they were kept only by the claims, and a topic starts its rotation anew.
DROP TABLE brooq_fair_turn;
DROP TABLE brooq_fair_clock;

-- The key served last ('': jobs without one) and the jobs it took in its current turn
-- (a turn is the key's weight in jobs); the next claim goes on with that key while its
-- turn has jobs left, else with the key after it in key order, wrapping round.
CREATE TABLE brooq_fair_cursor (
    topic   text    PRIMARY KEY,
    key     text    NOT NULL,
    used    int     NOT NULL CHECK (used >= 0)
);
