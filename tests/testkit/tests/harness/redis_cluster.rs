//! The 3-node cluster starter and the hash-slot rule, against the real `redis-server`'s
//! `CLUSTER KEYSLOT` and its `MOVED` answers.

use runr_testkit::redis::{key_slot, Cluster, Reply};

#[test]
fn a_three_node_cluster_and_the_slot_of_every_key_form() {
    let cluster = Cluster::start();
    let mut conn = cluster.conn(0);
    for key in [
        "orders",
        "orders-dlq",
        "{orders}",
        "{orders}-dlq",
        "x{orders}y",
        "{}orders",
        "a{}{b}",
        "a{b}c{d}",
        "{",
        "}{",
        "",
        "é{ü}",
    ] {
        let want = conn.cmd_str(&["CLUSTER", "KEYSLOT", key]).int();
        assert_eq!(i64::from(key_slot(key.as_bytes())), want, "{key:?}");
    }
    assert_ne!(key_slot(b"orders"), key_slot(b"orders-dlq"));
    assert_eq!(key_slot(b"{orders}"), key_slot(b"{orders}-dlq"));

    // Each node serves its own slots and sends the others on.
    let mut served = 0;
    for i in 0..3 {
        match cluster
            .conn(i)
            .cmd_str(&["XADD", "{orders}", "*", "k", "v"])
        {
            Reply::Bulk(_) => served += 1,
            Reply::Error(e) => assert!(e.starts_with("MOVED "), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(served, 1, "one node owns the slot");
}
