//! Printing the `ps --hw` view.

use gpreempt::model::hw::HwView;

pub fn print(v: &HwView) {
    println!();
    println!(
        "{:>8} {:>10} {:>6} {:>5} {:>13} {:>5} {:>20}  check",
        "GPU", "KFD queues", "MQDs", "XCCs", "active HQDs", "HIQs", "runlist"
    );
    for g in &v.gpus {
        println!(
            "{:>8} {:>10} {:>6} {:>5} {:>13} {:>5} {:>20}  {}",
            format!("{:#x}", g.gpu_id),
            g.kfd_compute_queues,
            g.mqd_compute_queues,
            g.xccs,
            g.active_compute_slots,
            g.active_hiqs,
            match &g.runlist {
                None => "-".to_owned(),
                Some(r) if !r.active => "none active".to_owned(),
                Some(r) => format!("{} proc, {} queues", r.processes, r.queues),
            },
            if g.findings.is_empty() { "ok".to_owned() } else { g.findings.join("; ") }
        );
    }
    for n in &v.notes {
        eprintln!("note: {n}");
    }
}
