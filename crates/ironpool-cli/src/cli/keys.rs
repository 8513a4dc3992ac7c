//! `load-key`, `unload-key`, `change-key`, and reading the user's key for
//! them and for `volume create -o encryption=on`.
//!
//! A key at `keylocation=prompt` is read here, from the terminal (without
//! echo) or from standard input when it is not one, and sent to the server
//! over its control socket (a local socket only root can open). A key at
//! `file:///PATH` is read by the server itself, as `serve --load-keys` does.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use ironpool::control::commands::Command;
use ironpool::pool::dataset::keys::hex;
use zeroize::Zeroizing;

use super::{admin, assignments, Context};

/// Most bytes read from standard input for a key: a passphrase's limit with
/// a newline (`crypto::PASSPHRASE_BYTES_MAX`).
const KEY_INPUT_BYTES_MAX: u64 = 514;

fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

/// Reads the user's key for `name`: from the terminal, asked for once (or
/// twice, `confirm`, for a new key), or all of standard input. Returns it
/// in hexadecimal, as the control socket carries it.
pub fn read_key(name: &str, confirm: bool) -> Result<Zeroizing<String>, String> {
    let stdin = std::io::stdin();
    let material = if stdin.is_terminal() {
        let first = prompt(&format!("Enter the key for '{name}': "))?;
        if confirm {
            let again = prompt(&format!("Re-enter the key for '{name}': "))?;
            if again != first {
                return Err("the two keys entered differ".into());
            }
        }
        first
    } else {
        let mut material = Zeroizing::new(Vec::new());
        stdin
            .lock()
            .take(KEY_INPUT_BYTES_MAX + 1)
            .read_to_end(&mut material)
            .map_err(|error| format!("reading the key from standard input: {error}"))?;
        if material.len() as u64 > KEY_INPUT_BYTES_MAX {
            return Err(format!(
                "standard input holds more than any key ({KEY_INPUT_BYTES_MAX} bytes)"
            ));
        }
        material
    };
    Ok(Zeroizing::new(hex(&material)))
}

/// One line from the terminal with its echo off (restored after, even on
/// an error), without the newline.
fn prompt(text: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{text}");
    let _ = stderr.flush();
    let fd = libc::STDIN_FILENO;
    // SAFETY: termios is plain data; tcgetattr fills it or fails.
    let mut saved: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is this process's standard input, `saved` a valid termios.
    let have_terminal = unsafe { libc::tcgetattr(fd, &mut saved) } == 0;
    if have_terminal {
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        quiet.c_lflag |= libc::ECHONL;
        // SAFETY: as above; `quiet` is a copy of the terminal's settings.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
    }
    let mut line = Zeroizing::new(String::new());
    let read = std::io::stdin().read_line(&mut line);
    if have_terminal {
        // SAFETY: restores the settings read above.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &saved) };
    }
    read.map_err(|error| format!("reading the key: {error}"))?;
    let text = line.trim_end_matches(['\n', '\r']);
    Ok(Zeroizing::new(text.as_bytes().to_vec()))
}

/// The key `volume create` sends: read here when the new volume is
/// encrypted and its key is at `prompt` (the default).
pub fn create_key(
    name: &str,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<Option<Zeroizing<String>>, String> {
    let encrypted = properties
        .get("encryption")
        .is_some_and(|value| value != "off");
    let prompted = properties
        .get("keylocation")
        .is_none_or(|location| location == "prompt");
    if encrypted && prompted {
        return read_key(name, true).map(Some);
    }
    Ok(None)
}

/// `load-key [-a] [-L LOCATION] [POOL/VOL]`.
pub fn load_key(
    context: &Context,
    all: bool,
    location: Option<&str>,
    name: &str,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let command = if all {
        Command::LoadKey {
            name: None,
            key: None,
            all: true,
        }
    } else {
        // The stored location is read by the server; a prompt, or a file
        // named with -L, is read here.
        let stored = keylocation(context, name, dirs)?;
        let location = location.unwrap_or(&stored);
        let key = if location == "prompt" {
            Some(read_key(name, false)?)
        } else if location == stored {
            None
        } else if location.starts_with("file:///") {
            // Bounded as the server reads its own key files: a file larger
            // than any key is refused, not read whole.
            let bytes = ironpool::pool::dataset::keys::read_key_file(name, location)
                .map_err(|error| error.to_string())?;
            Some(Zeroizing::new(hex(&bytes)))
        } else {
            return Err(format!(
                "-L {location}: expected prompt or file:///ABSOLUTE/PATH"
            ));
        };
        Command::LoadKey {
            name: Some(name.to_string()),
            key: key.map(|key| key.to_string()),
            all: false,
        }
    };
    let result = admin(context, pool_of(name), dirs, command)?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    for loaded in result["loaded"].as_array().into_iter().flatten() {
        println!("loaded the key of '{}'", loaded.as_str().unwrap_or("?"));
    }
    let failed = result["failed"].as_array().cloned().unwrap_or_default();
    for failure in &failed {
        eprintln!(
            "ironpool: {}: {}",
            failure["name"].as_str().unwrap_or("?"),
            failure["error"].as_str().unwrap_or("?")
        );
    }
    if !failed.is_empty() {
        return Err(format!("{} keys not loaded", failed.len()));
    }
    Ok(())
}

/// The `keylocation` of `name`, from the pool.
fn keylocation(context: &Context, name: &str, dirs: &[PathBuf]) -> Result<String, String> {
    let quiet = Context {
        control: context.control.clone(),
        json: true,
    };
    let result = admin(
        &quiet,
        pool_of(name),
        dirs,
        Command::GetProperties {
            name: name.to_string(),
            properties: vec!["keylocation".into()],
        },
    )?;
    result["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|row| row["property"] == "keylocation")
        .and_then(|row| row["value"].as_str())
        .filter(|location| *location != "none")
        .map(str::to_string)
        .ok_or_else(|| format!("{name} is not encrypted"))
}

/// `unload-key POOL/VOL`.
pub fn unload_key(context: &Context, name: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(
        context,
        pool_of(name),
        dirs,
        Command::UnloadKey {
            name: name.to_string(),
        },
    )?;
    match context.json {
        true => println!("{result}"),
        false => println!("unloaded the key of '{name}'"),
    }
    Ok(())
}

/// `change-key [-o keyformat=...] [-o keylocation=...] [-o pbkdf2iters=N]
/// POOL/VOL`: the new key is read from the new (or the same) location.
pub fn change_key(
    context: &Context,
    name: &str,
    options: &[String],
    dirs: &[PathBuf],
) -> Result<(), String> {
    let properties = assignments(options)?;
    let location = match properties.get("keylocation") {
        Some(location) => location.clone(),
        None => keylocation(context, name, dirs)?,
    };
    let key = match location.as_str() {
        "prompt" => Some(read_key(name, true)?),
        _ => None,
    };
    let result = admin(
        context,
        pool_of(name),
        dirs,
        Command::ChangeKey {
            name: name.to_string(),
            properties,
            key: key.map(|key| key.to_string()),
        },
    )?;
    match context.json {
        true => println!("{result}"),
        false => println!("changed the key of '{name}'"),
    }
    Ok(())
}
