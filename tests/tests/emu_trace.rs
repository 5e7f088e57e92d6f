//! The unchanged `gpreempt trace` against the KFD emulator (emulator VM pass): queue creates
//! that succeed come out with ret 0 and the driver's queue id, destroys of real queues with
//! ret 0. On amdgpu without a GPU every create fails, so only the emulator shows this.

use gpreempt_tests::{LineHelper, Tracer, events_of, summary};

#[test]
fn successful_creates_and_destroys_are_traced_with_their_queue_ids() {
    let tracer = Tracer::start(&[]).unwrap();
    let mut w = LineHelper::spawn("emu-workload", &["run", "--gpu-id", "0x2000", "--queues", "2"]).unwrap();
    let pid = w.pid();
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], 0);
    assert_eq!(w.cmd("destroy 0").unwrap()["ret"], -22, "already destroyed");
    assert!(w.finish().unwrap().success());
    let objects = tracer.stop().unwrap();

    let creates = events_of(&objects, pid, "queue_create");
    assert_eq!(creates.len(), 2, "{objects:?}");
    for (e, id) in creates.iter().zip([0, 1]) {
        assert_eq!(e["result"], "OK");
        assert_eq!(e["ret"], 0);
        assert_eq!(e["queue_id"], id);
        assert_eq!(e["gpu_id"], 0x2000);
        assert_eq!(e["queue_type"], "compute-aql");
        assert_eq!(e["ring_size"], 4096);
        assert_eq!(e["comm"], "emu-workload");
    }
    let destroys = events_of(&objects, pid, "queue_destroy");
    assert_eq!(destroys.len(), 2, "{objects:?}");
    assert_eq!(
        (&destroys[0]["queue_id"], &destroys[0]["ret"], &destroys[0]["result"]),
        (&0.into(), &0.into(), &"OK".into())
    );
    assert_eq!((&destroys[1]["queue_id"], &destroys[1]["ret"]), (&0.into(), &(-22).into()));
    assert_eq!(summary(&objects).unwrap()["dropped"], 0);
}
