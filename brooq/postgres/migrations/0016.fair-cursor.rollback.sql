DROP TABLE brooq_fair_cursor;
CREATE TABLE brooq_fair_turn (
    topic   text    NOT NULL,
    key     text    NOT NULL,
    finish  float8  NOT NULL,
    PRIMARY KEY (topic, key)
);
CREATE TABLE brooq_fair_clock (
    topic   text    PRIMARY KEY,
    clock   float8  NOT NULL
);
