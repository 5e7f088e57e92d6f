//! A [`Snapshot`] laid out: as plain text (`gpreempt top --once`) and as a ratatui frame (the
//! live view), with the same tables and cells; and the live view's keys ([`Ui::key`]).

use std::fmt::Write;

use ratatui::{
    Frame,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Cell, Paragraph, Row, Table},
};

use super::{
    GPU_HEADER, Order, PROCESS_HEADER, SPAN_HEADER, Snapshot, gpu_cells, process_cells, scheduler::SchedulerGpu,
    span_cells,
};
use crate::output::text::escape;

/// Column headers of [`scheduler_cells`].
pub const SCHEDULER_HEADER: [&str; 10] =
    ["POLICY", "GPU", "STATE", "SUSPENDS", "RESUMES", "HELD s", "REACTIONS", "REACT us", "P99 <= us", "SKIPPED"];

pub fn scheduler_cells(g: &SchedulerGpu) -> [String; 10] {
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    [
        escape(&g.policy).into_owned(),
        format!("{:#x}", g.gpu_id),
        g.state.to_owned(),
        g.suspends.to_string(),
        g.resumes.to_string(),
        format!("{:.3}", g.held_s),
        g.reactions.to_string(),
        us(g.reaction_mean_us),
        us(g.reaction_p99_le_us),
        g.resumes_skipped.to_string(),
    ]
}

/// The first line: what is shown, and the tracer's health.
pub fn title(s: &Snapshot, order: &Order) -> String {
    let queues: usize = s.processes.iter().map(super::ProcessRow::queue_count).sum();
    let filter =
        if order.filter.is_empty() { String::new() } else { format!(", filter \"{}\"", escape(&order.filter)) };
    format!(
        "gpreempt top: {} KFD processes, {queues} queues, {} GPUs; tracer {} probes ({} missing), {} events, {} lost; \
         sort {}{}{filter}",
        s.processes.len(),
        s.gpus.len(),
        s.tracer.probes_attached,
        s.tracer.probes_missing,
        s.tracer.events,
        s.tracer.lost,
        order.sort.name(),
        if order.reverse { " (reversed)" } else { "" },
    )
}

/// The scheduler's line: where it is read from, or why it is not shown.
pub fn scheduler_line(s: &Snapshot) -> String {
    match (&s.scheduler.source, &s.scheduler.error) {
        (None, _) => "scheduler: not read (--no-agent)".to_owned(),
        (Some(_), Some(e)) => format!("scheduler: {e}"),
        (Some(src), None) if s.scheduler.gpus.is_empty() => {
            format!("scheduler: the agent at {src} runs no policy that has acted on a GPU yet")
        }
        (Some(src), None) => format!("scheduler: agent at {src}"),
    }
}

/// Said under the process table when a state is as of `top`'s start (sysfs has none).
pub const STATE_NOTE: &str =
    "*: found in sysfs at start and unchanged since, taken as active (sysfs has no queue state)";

fn any_unseen(s: &Snapshot, order: &Order) -> bool {
    order.apply(&s.processes).iter().any(|p| p.gpus.iter().any(|g| g.queues.iter().any(|q| !q.state_seen)))
}

/// Process table rows: a `*` after a state that is as of the start.
fn process_rows(s: &Snapshot, order: &Order) -> Vec<[String; 9]> {
    order
        .apply(&s.processes)
        .into_iter()
        .flat_map(|p| {
            process_cells(p).into_iter().zip(p.gpus.iter().map(Some).chain(std::iter::repeat(None))).map(
                |(mut c, g)| {
                    if g.is_some_and(|g| g.queues.iter().any(|q| !q.state_seen)) {
                        c[6].push('*');
                    }
                    c
                },
            )
        })
        .collect()
}

fn table_text<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (c, w) in cells.zip(widths) {
            let _ = write!(l, "{c:<w$}  ");
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(out, &mut header.iter().copied());
    for r in rows {
        line(out, &mut r.iter().map(String::as_str));
    }
}

/// One frame as plain text (`--once`): title, GPUs, processes, scheduler, the latest `spans` spans.
pub fn text(s: &Snapshot, order: &Order, spans: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", title(s, order));
    table_text(&mut out, GPU_HEADER, &s.gpus.iter().map(gpu_cells).collect::<Vec<_>>());
    out.push('\n');
    table_text(&mut out, PROCESS_HEADER, &process_rows(s, order));
    if any_unseen(s, order) {
        let _ = writeln!(out, "{STATE_NOTE}");
    }
    let _ = writeln!(out, "\n{}", scheduler_line(s));
    if !s.scheduler.gpus.is_empty() {
        table_text(&mut out, SCHEDULER_HEADER, &s.scheduler.gpus.iter().map(scheduler_cells).collect::<Vec<_>>());
    }
    let _ = writeln!(out, "\nspans, latest first ({} shown):", s.spans.len().min(spans));
    table_text(&mut out, SPAN_HEADER, &s.spans.iter().take(spans).map(|r| span_cells(r, s.ts_ns)).collect::<Vec<_>>());
    out
}

/// The live view's state beyond the snapshot: the order, and the filter being typed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ui {
    pub order: Order,
    /// `/` was pressed: keys edit the filter until Enter (keep) or Esc (clear).
    pub editing: bool,
}

/// What a key asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    /// Draw again (the order or filter changed).
    Redraw,
    Quit,
}

/// The keys, as the footer says them.
pub const KEYS: &str = "q quit  s sort  r reverse  / filter (Enter keep, Esc clear)  c clear filter";

impl Ui {
    pub fn key(&mut self, key: KeyEvent) -> Action {
        // In raw mode Ctrl-C arrives as a key, not as SIGINT.
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if self.editing {
            match key.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.order.filter.clear();
                }
                KeyCode::Backspace => {
                    self.order.filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() => self.order.filter.push(c),
                _ => return Action::None,
            }
            return Action::Redraw;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
            KeyCode::Char('s') => {
                self.order.sort = self.order.sort.next();
                Action::Redraw
            }
            KeyCode::Char('r') => {
                self.order.reverse = !self.order.reverse;
                Action::Redraw
            }
            KeyCode::Char('/') => {
                self.editing = true;
                Action::Redraw
            }
            KeyCode::Char('c') => {
                self.order.filter.clear();
                Action::Redraw
            }
            _ => Action::None,
        }
    }
}

fn table<'a, const N: usize>(title: String, header: [&'a str; N], rows: Vec<[String; N]>) -> Table<'a> {
    let mut widths = header.map(|h| h.len() as u16);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count() as u16);
        }
    }
    let bold = Style::default().add_modifier(Modifier::BOLD);
    Table::new(rows.into_iter().map(|r| Row::new(r.map(Cell::from))), widths.map(Constraint::Length))
        .header(Row::new(header.map(Cell::from)).style(bold))
        .block(Block::bordered().title(title))
}

/// Draw one frame of the live view.
pub fn draw(frame: &mut Frame, s: &Snapshot, ui: &Ui) {
    let processes = process_rows(s, &ui.order);
    let scheduler: Vec<[String; 10]> = s.scheduler.gpus.iter().map(scheduler_cells).collect();
    let note = any_unseen(s, &ui.order);
    let [head, gpus, procs, sched, spans, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(s.gpus.len() as u16 + 3),
        Constraint::Min(processes.len().min(12) as u16 + 3 + u16::from(note)),
        Constraint::Length(if scheduler.is_empty() { 3 } else { scheduler.len() as u16 + 3 }),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(title(s, &ui.order)), head);
    frame.render_widget(table("GPUs".into(), GPU_HEADER, s.gpus.iter().map(gpu_cells).collect()), gpus);
    let procs_title = format!("KFD processes ({} shown)", ui.order.apply(&s.processes).len());
    if note {
        let [t, n] = Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(procs);
        frame.render_widget(table(procs_title, PROCESS_HEADER, processes), t);
        frame.render_widget(Paragraph::new(STATE_NOTE), n);
    } else {
        frame.render_widget(table(procs_title, PROCESS_HEADER, processes), procs);
    }
    if scheduler.is_empty() {
        frame.render_widget(Paragraph::new(scheduler_line(s)).block(Block::bordered().title("scheduler")), sched);
    } else {
        frame.render_widget(table(scheduler_line(s), SCHEDULER_HEADER, scheduler), sched);
    }
    let rows: Vec<[String; 11]> = s.spans.iter().map(|r| span_cells(r, s.ts_ns)).collect();
    frame.render_widget(table("spans, latest first".into(), SPAN_HEADER, rows), spans);
    let footer = if ui.editing {
        format!("filter: {}_  (Enter keep, Esc clear)", escape(&ui.order.filter))
    } else {
        KEYS.to_owned()
    };
    frame.render_widget(Paragraph::new(Line::from(footer)), foot);
}
