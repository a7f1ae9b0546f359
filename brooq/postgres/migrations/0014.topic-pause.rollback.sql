DROP TABLE brooq_topic_pause;
