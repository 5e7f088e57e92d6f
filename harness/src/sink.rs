//! `harness sink` (hidden): the receiver of `harness packet-cost`. It listens on a loopback port
//! (printed as its first line), answers every message on every connection at once — `POST` with
//! `{"id":N}`, `GET` with `ok` — and exits when its stdin closes. Started in a cgroup of its own,
//! where the arrival program is attached and detached around it.

use std::{
    io::{BufReader, Read, Write},
    net::{TcpListener, TcpStream},
};

use anyhow::{Context, Result};

use crate::http::{self, Ask};

fn connection(stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(m) = http::read(&mut reader)? {
        let answer = match m.ask() {
            Ask::Generate { id } => http::response(200, format!("{{\"id\":{id}}}").as_bytes()),
            Ask::Health | Ask::Metrics => http::response(200, b"ok"),
            Ask::Other => http::response(404, b""),
        };
        http::send(&mut out, &answer)?;
    }
    Ok(())
}

pub fn run() -> Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("listening on a loopback port")?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", listener.local_addr()?.port())?;
    stdout.flush()?;
    // Ends the process when the harness closes our stdin (or dies).
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    for stream in listener.incoming() {
        let stream = stream.context("accepting")?;
        std::thread::spawn(move || connection(stream));
    }
    Ok(())
}
