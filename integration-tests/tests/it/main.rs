//! Every integration test in one binary: Cargo links a test target per file under `tests/`,
//! and each link is of the whole agent, so the files are modules of this one target instead.
//! Tests keep their names under their file's module (`t80_safety_loopback::faults_on_...`);
//! run one file with `cargo test -p integration-tests --test it t80_safety_loopback`.
//!
//! libtest runs the tests of all files side by side (one thread per core), so no test may
//! change process-wide state (environment, current directory, signal handlers), and the
//! heaviest ones take [`common::exclusive`] so that no two of them run at once.

mod common;

mod t10_api;
mod t10_https;
mod t10_kv;
mod t10_session;
mod t10_smoke;
mod t10_tls_cli;
mod t10_txn;
mod t15_agent_checks;
mod t16_catalog_health;
mod t20_session_ttl_lock_delay;
mod t30_kv_bad_input;
mod t31_http_hardening;
mod t40_consul_client;
mod t50_cluster;
mod t51_cluster_failover;
mod t51_server_rejoin;
mod t52_server_identity;
mod t53_large_entries;
mod t54_many_watchers;
mod t55_evidence_failover;
mod t55_leader_terms;
mod t56_cluster_checks;
mod t57_exhaustion;
mod t57_full_disk;
mod t58_consul_drop_in;
mod t59_consul_cli;
mod t60_lock_cli;
mod t60_recipes;
mod t61_lock_queue;
mod t62_lock_history;
mod t63_go_client;
mod t70_gossip;
mod t71_gossip_hardening;
mod t80_safety_docker;
mod t80_safety_loopback;
mod t80_safety_negative_control;
mod t81_jepsen;
mod t90_ui_browser;
mod t92_operate;
mod t93_acl;
mod t94_rolling_upgrade;
mod t95_blocking_budget;
mod t96_coalesced_watchers;
mod t97_acquire_herd;
