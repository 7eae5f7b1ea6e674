-- 002_task_document.sql - the document each task stored or read.
--
-- One task per document (proto/task.h): a summarize or answer may bring
-- its document (text or url) and ingest it inside the same task. The
-- worker records the document in the task's row in the same transaction
-- that stores it, so a redelivery of the task finds it there instead of
-- fetching and storing it again, and the row says which document a task
-- used (ingest: the one stored; summarize: the one summarized; answer:
-- the one retrieved from, NULL over every document). No foreign key: a
-- task row is history and outlives a deleted document.

ALTER TABLE tasks ADD COLUMN document_id bigint;
