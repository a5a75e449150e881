//! Freewrite: bubble planner, record files, log and LSM stores; built by a later issue.
