//! SHA-256 of a download in a worker of its own, so hashing overlaps the network and the disk.
//!
//! The offscreen document starts this worker beside the download worker and links the two with a
//! `MessageChannel` (`{ op: "port", port }`); it terminates both when the download ends. (A worker
//! nested in the download worker sometimes outlived the download worker's termination in Chromium.)
//! The download worker reads each block of a response into a buffer, writes it to OPFS, then transfers
//! the buffer here; this worker hashes it and transfers it back for the next read. Messages keep their
//! order, so a `checkpoint` answered here is the hash state exactly after the blocks sent before it.
//!
//! Protocol: in `{ op: "reset", checkpoint? }`, `{ op: "data", buffer, length }`, `{ op: "checkpoint" }`,
//! `{ op: "finish" }`; out `{ op: "buffer", buffer }`, `{ op: "checkpoint", checkpoint }`,
//! `{ op: "digest", digest }` (32 bytes), `{ op: "error", message }`.

use std::cell::RefCell;

use futures_channel::mpsc;
use futures_util::StreamExt;
use imagine_core::hub::{HashCheckpoint, ResumableSha256};
use js_sys::{Array, ArrayBuffer, Uint8Array};
use wasm_bindgen::prelude::*;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent, MessagePort};

use crate::js::{error_text, from_js, get, get_f64, get_string, to_js, Obj};

/// Blocks lent to the hash worker at most: how far hashing may fall behind writing.
pub const MAX_LENT: usize = 2;

thread_local! {
    static HASHER: RefCell<(ResumableSha256, Vec<u8>)> = RefCell::new((ResumableSha256::new(), Vec::new()));
}

/// Entry point of `hash-worker.js`: waits for the port to the download worker, then serves it.
#[wasm_bindgen(js_name = hashWorkerMain)]
pub fn hash_worker_main() {
    let scope: DedicatedWorkerGlobalScope = js_sys::global().unchecked_into();
    let on_port = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
        let port: MessagePort = get(&event.data(), "port").unchecked_into();
        let reply_port = port.clone();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let message = event.data();
            let reply = HASHER.with_borrow_mut(|(hasher, scratch)| handle(hasher, scratch, &message));
            let sent = match reply {
                Ok((reply, Some(buffer))) => {
                    reply_port.post_message_with_transferable(&reply, &Array::of1(&buffer))
                }
                Ok((reply, None)) => reply_port.post_message(&reply),
                Err(message) => {
                    reply_port.post_message(&Obj::new().set("op", "error").set("message", message).build())
                }
            };
            if let Err(e) = sent {
                web_sys::console::error_1(&e);
            }
        });
        port.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        // The handler lives as long as the worker.
        on_message.forget();
    });
    scope.set_onmessage(Some(on_port.as_ref().unchecked_ref()));
    on_port.forget();
}

fn handle(
    hasher: &mut ResumableSha256,
    scratch: &mut Vec<u8>,
    message: &JsValue,
) -> Result<(JsValue, Option<ArrayBuffer>), String> {
    match get_string(message, "op").as_deref() {
        Some("reset") => {
            let checkpoint = get(message, "checkpoint");
            *hasher = if checkpoint.is_undefined() || checkpoint.is_null() {
                ResumableSha256::new()
            } else {
                ResumableSha256::from_checkpoint(&from_js(&checkpoint)?).map_err(|e| e.to_string())?
            };
            Ok((Obj::new().set("op", "reset").build(), None))
        }
        Some("data") => {
            let buffer: ArrayBuffer = get(message, "buffer").unchecked_into();
            let length = get_f64(message, "length").unwrap_or(0.0) as u32;
            scratch.resize(length as usize, 0);
            Uint8Array::new_with_byte_offset_and_length(&buffer, 0, length).copy_to(scratch);
            hasher.update(scratch);
            Ok((Obj::new().set("op", "buffer").set("buffer", buffer.clone()).build(), Some(buffer)))
        }
        Some("checkpoint") => {
            let checkpoint = hasher.aligned_checkpoint();
            Ok((Obj::new().set("op", "checkpoint").set("checkpoint", to_js(&checkpoint)).build(), None))
        }
        Some("finish") => {
            let digest = Uint8Array::from(hasher.clone().finalize().as_slice());
            Ok((Obj::new().set("op", "digest").set("digest", digest).build(), None))
        }
        other => Err(format!("hash worker: unknown op {other:?}")),
    }
}

/// The download worker's end of the link to its hash worker, and the pool of buffers the two pass back
/// and forth.
pub struct HashWorker {
    port: MessagePort,
    inbox: mpsc::UnboundedReceiver<JsValue>,
    spare: Vec<ArrayBuffer>,
    lent: usize,
    block_bytes: u32,
    /// A checkpoint was asked for and has not been taken yet.
    checkpoint_asked: bool,
    /// The answer to it, once it came.
    checkpoint: Option<HashCheckpoint>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
}

impl HashWorker {
    /// Talks to the hash worker through `port`; buffers are `block_bytes` long.
    pub fn connect(port: MessagePort, block_bytes: u32) -> HashWorker {
        let (sender, inbox) = mpsc::unbounded();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let _ = sender.unbounded_send(event.data());
        });
        port.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        HashWorker {
            port,
            inbox,
            spare: Vec::new(),
            lent: 0,
            block_bytes,
            checkpoint_asked: false,
            checkpoint: None,
            _on_message: on_message,
        }
    }

    fn send(&self, message: &JsValue, buffer: Option<&ArrayBuffer>) -> Result<(), String> {
        match buffer {
            Some(buffer) => self.port.post_message_with_transferable(message, &Array::of1(buffer)),
            None => self.port.post_message(message),
        }
        .map_err(|e| error_text(&e))
    }

    /// Takes in one message: a returned buffer goes back to the pool, a checkpoint is kept until
    /// taken; anything else is handed back.
    fn accept(&mut self, message: JsValue) -> Result<Option<JsValue>, String> {
        match get_string(&message, "op").as_deref() {
            Some("buffer") => {
                self.spare.push(get(&message, "buffer").unchecked_into());
                self.lent -= 1;
                Ok(None)
            }
            Some("checkpoint") => {
                self.checkpoint = Some(from_js(&get(&message, "checkpoint"))?);
                Ok(None)
            }
            Some("error") | None => {
                Err(get_string(&message, "message").unwrap_or_else(|| "the hash worker failed".into()))
            }
            Some(_) => Ok(Some(message)),
        }
    }

    /// Takes in a message that must not be a reply.
    fn accept_unasked(&mut self, message: JsValue) -> Result<(), String> {
        match self.accept(message)? {
            Some(message) => Err(format!("the hash worker sent {:?} unasked", get_string(&message, "op"))),
            None => Ok(()),
        }
    }

    async fn next(&mut self) -> Result<JsValue, String> {
        self.inbox.next().await.ok_or_else(|| "the hash worker stopped".to_string())
    }

    /// Waits for the reply `op`, taking in the messages before it.
    async fn reply(&mut self, op: &str) -> Result<JsValue, String> {
        loop {
            let message = self.next().await?;
            if let Some(message) = self.accept(message)? {
                if get_string(&message, "op").as_deref() == Some(op) {
                    return Ok(message);
                }
                return Err(format!(
                    "the hash worker answered {:?} where {op} was due",
                    get_string(&message, "op")
                ));
            }
        }
    }

    /// Starts over from a checkpoint (or from the first byte).
    pub async fn reset(&mut self, checkpoint: Option<&HashCheckpoint>) -> Result<(), String> {
        let mut message = Obj::new().set("op", "reset");
        if let Some(checkpoint) = checkpoint {
            message = message.set("checkpoint", to_js(checkpoint));
        }
        self.send(&message.build(), None)?;
        self.reply("reset").await?;
        // A checkpoint asked for before the reset belongs to the bytes before it.
        self.checkpoint_asked = false;
        self.checkpoint = None;
        Ok(())
    }

    /// A buffer to read the next block into: a returned one, a new one while few are lent, or the
    /// next one returned (which holds the download back while hashing catches up).
    pub async fn buffer(&mut self) -> Result<ArrayBuffer, String> {
        loop {
            if let Some(buffer) = self.spare.pop() {
                return Ok(buffer);
            }
            if self.lent < MAX_LENT {
                return Ok(ArrayBuffer::new(self.block_bytes));
            }
            let message = self.next().await?;
            self.accept_unasked(message)?;
        }
    }

    /// Keeps a buffer that carries no data for the next read.
    pub fn give_back(&mut self, buffer: ArrayBuffer) {
        if buffer.byte_length() == self.block_bytes {
            self.spare.push(buffer);
        }
    }

    /// Hashes the first `length` bytes of `buffer`, which is transferred (it comes back to the pool).
    pub fn hash(&mut self, buffer: ArrayBuffer, length: u32) -> Result<(), String> {
        let message =
            Obj::new().set("op", "data").set("buffer", buffer.clone()).set("length", length).build();
        self.send(&message, Some(&buffer))?;
        self.lent += 1;
        Ok(())
    }

    /// Asks for the hash state after every block sent so far. The download goes on meanwhile;
    /// [`HashWorker::take_checkpoint`] has the answer once it came.
    pub fn ask_checkpoint(&mut self) -> Result<(), String> {
        self.send(&Obj::new().set("op", "checkpoint").build(), None)?;
        self.checkpoint_asked = true;
        Ok(())
    }

    /// Whether a checkpoint was asked for and not taken yet.
    pub fn checkpoint_asked(&self) -> bool {
        self.checkpoint_asked
    }

    /// The checkpoint asked for, if its answer came (without waiting for it).
    pub fn take_checkpoint(&mut self) -> Result<Option<HashCheckpoint>, String> {
        while let Ok(Some(message)) = self.inbox.try_next() {
            self.accept_unasked(message)?;
        }
        let checkpoint = self.checkpoint.take();
        if checkpoint.is_some() {
            self.checkpoint_asked = false;
        }
        Ok(checkpoint)
    }

    /// The checkpoint asked for, waiting for its answer if need be (after a failed request, so that
    /// what was read before the failure still counts).
    pub async fn wait_checkpoint(&mut self) -> Result<HashCheckpoint, String> {
        while self.checkpoint.is_none() {
            let message = self.next().await?;
            self.accept_unasked(message)?;
        }
        self.checkpoint_asked = false;
        Ok(self.checkpoint.take().expect("checked above"))
    }

    /// The SHA-256 of everything sent since the last reset.
    pub async fn finish(&mut self) -> Result<[u8; 32], String> {
        self.send(&Obj::new().set("op", "finish").build(), None)?;
        let digest: Uint8Array = get(&self.reply("digest").await?, "digest").unchecked_into();
        digest.to_vec().try_into().map_err(|_| "the hash worker sent a malformed digest".to_string())
    }
}

impl Drop for HashWorker {
    fn drop(&mut self) {
        self.port.close();
    }
}
