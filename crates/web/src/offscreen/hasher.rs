//! SHA-256 of a download in a worker of its own, so hashing overlaps the network and the disk.
//!
//! The offscreen document starts this worker beside the download worker and links the two with a
//! `MessageChannel` ([`HashSetup`]); it terminates both when the download ends. (A worker
//! nested in the download worker sometimes outlived the download worker's termination in Chromium.)
//! The download worker reads each block of a response into a buffer, writes it to OPFS, then transfers
//! the buffer here; this worker hashes it and transfers it back for the next read. Messages keep their
//! order, so a `checkpoint` answered here is the hash state exactly after the blocks sent before it.
//!
//! Messages: [`HashSetup`], [`HashCommand`] and [`HashReport`] (`crate::platform::protocol`).

use std::cell::RefCell;

use std::pin::pin;

use futures_channel::mpsc;
use futures_util::future::{select, Either};
use futures_util::StreamExt;
use imagine_core::hub::{HashCheckpoint, HubError, ResumableSha256};
use imagine_core::message::{arg, ErrorText, Localize, Message};
use js_sys::{ArrayBuffer, Uint8Array};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent, MessagePort};

use crate::platform::js::sleep_ms;
use crate::platform::protocol::{self, HashCommand, HashReport, HashSetup, ProtocolError};

/// Why hashing failed, on either side of the link between the download worker and its hash worker.
#[derive(Debug, Error)]
pub enum HashError {
    /// A checkpoint the hash state cannot be restored from.
    #[error(transparent)]
    Checkpoint(#[from] HubError),
    /// A message on the link that is not of its type, or one that could not be posted.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A [`HashCommand::Data`] came without its buffer (hash worker side).
    #[error("hash worker: data without a buffer")]
    NoData,
    /// A [`HashReport::Buffer`] came without the buffer (download worker side).
    #[error("the hash worker returned no buffer")]
    NoBuffer,
    /// What the hash worker reported (its own [`HashError`], as text: it crossed `postMessage`).
    #[error("{0}")]
    Reported(ErrorText),
    /// A reply nothing asked for (`reply` as Rust prints it).
    #[error("the hash worker sent {reply} unasked")]
    Unasked {
        /// The reply, as Rust debug-prints it.
        reply: String,
    },
    /// Another reply than the one due (`when`: "to a reset", "where a digest was due").
    #[error("the hash worker answered {reply} {when}")]
    Unexpected {
        /// The reply, as Rust debug-prints it.
        reply: String,
        /// What was due instead.
        when: &'static str,
    },
    /// The link to the hash worker closed: it is gone.
    #[error("the hash worker stopped")]
    Stopped,
    /// The hash worker answered nothing for `seconds` while an answer was due: it died or hangs (a
    /// port to a worker that died never closes). The install starts again from its checkpoint.
    #[error("the hash worker answered nothing for {seconds} s and was given up")]
    Silent {
        /// How long it was waited for, in seconds.
        seconds: u64,
    },
}

/// How long the download worker waits for an answer the hash worker owes it (hashing a block takes
/// milliseconds) before it takes the hash worker for dead; a test shortens it with the OPFS file
/// [`WORKER_LIMIT_FILE`].
pub const HASH_SILENCE_MS: u64 = 60_000;

/// The OPFS file in which a test shortens how long a worker may leave a task or an answer due: the
/// hash worker's silence, the store of the re-blocked forms.
pub const WORKER_LIMIT_FILE: &str = "worker-limit-ms";

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
        let port: MessagePort = match protocol::read::<HashSetup>(&event.data()) {
            Ok((HashSetup::Port, Some(port))) => port.unchecked_into(),
            _ => return web_sys::console::error_1(&"hash worker: no port to the download worker".into()),
        };
        let reply_port = port.clone();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let reply = protocol::read::<HashCommand>(&event.data()).map_err(HashError::from).and_then(
                |(command, data)| {
                    HASHER.with_borrow_mut(|(hasher, scratch)| handle(hasher, scratch, command, data))
                },
            );
            match reply {
                // Lets a test make this worker die at a checkpoint, as a crashed worker would: its port
                // then never answers. The state is taken before, so it stays the one after the blocks
                // sent before the checkpoint however late it is posted.
                Ok((reply @ HashReport::Checkpoint { .. }, _)) => {
                    let port = reply_port.clone();
                    spawn_local(async move {
                        if crate::platform::opfs::failpoint_reached("hash:dies").await {
                            web_sys::console::log_1(&"imagine: failpoint hash:dies reached".into());
                            js_sys::global().unchecked_into::<DedicatedWorkerGlobalScope>().close();
                            return;
                        }
                        posted(protocol::post(&port, &reply, None));
                    });
                }
                Ok((reply, data)) => posted(protocol::post(&reply_port, &reply, data.as_ref())),
                Err(error) => {
                    posted(protocol::post(&reply_port, &HashReport::Error(ErrorText::of(&error)), None))
                }
            }
        });
        port.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        // The handler lives as long as the worker.
        on_message.forget();
    });
    scope.set_onmessage(Some(on_port.as_ref().unchecked_ref()));
    on_port.forget();
}

/// Logs a reply that could not be posted.
fn posted(sent: Result<(), ProtocolError>) {
    if let Err(e) = sent {
        web_sys::console::error_1(&e.to_string().into());
    }
}

fn handle(
    hasher: &mut ResumableSha256,
    scratch: &mut Vec<u8>,
    command: HashCommand,
    data: Option<JsValue>,
) -> Result<(HashReport, Option<JsValue>), HashError> {
    match command {
        HashCommand::Reset { checkpoint } => {
            *hasher = match checkpoint {
                Some(checkpoint) => ResumableSha256::from_checkpoint(&checkpoint)?,
                None => ResumableSha256::new(),
            };
            Ok((HashReport::Reset, None))
        }
        HashCommand::Data { length } => {
            let buffer: ArrayBuffer = data.ok_or(HashError::NoData)?.unchecked_into();
            scratch.resize(length as usize, 0);
            Uint8Array::new_with_byte_offset_and_length(&buffer, 0, length).copy_to(scratch);
            hasher.update(scratch);
            Ok((HashReport::Buffer, Some(buffer.into())))
        }
        HashCommand::Checkpoint => {
            Ok((HashReport::Checkpoint { checkpoint: hasher.aligned_checkpoint() }, None))
        }
        HashCommand::Finish => Ok((HashReport::Digest { digest: hasher.clone().finalize() }, None)),
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
    /// How long an answer may be due before the hash worker is taken for dead.
    silence_ms: u64,
    /// A checkpoint was asked for and has not been taken yet.
    checkpoint_asked: bool,
    /// The answer to it, once it came.
    checkpoint: Option<HashCheckpoint>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
}

impl HashWorker {
    /// Talks to the hash worker through `port`; buffers are `block_bytes` long; an answer due for
    /// `silence_ms` fails with [`HashError::Silent`].
    pub fn connect(port: MessagePort, block_bytes: u32, silence_ms: u64) -> HashWorker {
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
            silence_ms,
            checkpoint_asked: false,
            checkpoint: None,
            _on_message: on_message,
        }
    }

    fn send(&self, command: &HashCommand, buffer: Option<&ArrayBuffer>) -> Result<(), HashError> {
        Ok(protocol::post(&self.port, command, buffer.map(|b| b.as_ref()))?)
    }

    /// Takes in one message: a returned buffer goes back to the pool, a checkpoint is kept until
    /// taken; a reply is handed back.
    fn accept(&mut self, message: JsValue) -> Result<Option<HashReport>, HashError> {
        match protocol::read::<HashReport>(&message)? {
            (HashReport::Buffer, Some(buffer)) => {
                self.spare.push(buffer.unchecked_into());
                self.lent -= 1;
                Ok(None)
            }
            (HashReport::Buffer, None) => Err(HashError::NoBuffer),
            (HashReport::Checkpoint { checkpoint }, _) => {
                self.checkpoint = Some(checkpoint);
                Ok(None)
            }
            (HashReport::Error(error), _) => Err(HashError::Reported(error)),
            (reply, _) => Ok(Some(reply)),
        }
    }

    /// Takes in a message that must not be a reply.
    fn accept_unasked(&mut self, message: JsValue) -> Result<(), HashError> {
        match self.accept(message)? {
            Some(reply) => Err(HashError::Unasked { reply: format!("{reply:?}") }),
            None => Ok(()),
        }
    }

    /// The next message of the hash worker, which is due: one that does not come within the silence
    /// limit fails.
    async fn next(&mut self) -> Result<JsValue, HashError> {
        if let Ok(message) = self.inbox.try_next() {
            return message.ok_or(HashError::Stopped);
        }
        let silence = sleep_ms(self.silence_ms);
        match select(self.inbox.next(), pin!(silence)).await {
            Either::Left((message, _)) => message.ok_or(HashError::Stopped),
            Either::Right(_) => Err(HashError::Silent { seconds: self.silence_ms.div_ceil(1000) }),
        }
    }

    /// Waits for the next reply, taking in the messages before it.
    async fn reply(&mut self) -> Result<HashReport, HashError> {
        loop {
            let message = self.next().await?;
            if let Some(reply) = self.accept(message)? {
                return Ok(reply);
            }
        }
    }

    /// Starts over from a checkpoint (or from the first byte).
    pub async fn reset(&mut self, checkpoint: Option<&HashCheckpoint>) -> Result<(), HashError> {
        self.send(&HashCommand::Reset { checkpoint: checkpoint.copied() }, None)?;
        match self.reply().await? {
            HashReport::Reset => {}
            other => return Err(HashError::Unexpected { reply: format!("{other:?}"), when: "to a reset" }),
        }
        // A checkpoint asked for before the reset belongs to the bytes before it.
        self.checkpoint_asked = false;
        self.checkpoint = None;
        Ok(())
    }

    /// A buffer to read the next block into: a returned one, a new one while few are lent, or the
    /// next one returned (which holds the download back while hashing catches up).
    pub async fn buffer(&mut self) -> Result<ArrayBuffer, HashError> {
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
    pub fn hash(&mut self, buffer: ArrayBuffer, length: u32) -> Result<(), HashError> {
        self.send(&HashCommand::Data { length }, Some(&buffer))?;
        self.lent += 1;
        Ok(())
    }

    /// Asks for the hash state after every block sent so far. The download goes on meanwhile;
    /// [`HashWorker::take_checkpoint`] has the answer once it came.
    pub fn ask_checkpoint(&mut self) -> Result<(), HashError> {
        self.send(&HashCommand::Checkpoint, None)?;
        self.checkpoint_asked = true;
        Ok(())
    }

    /// Whether a checkpoint was asked for and not taken yet.
    pub fn checkpoint_asked(&self) -> bool {
        self.checkpoint_asked
    }

    /// The checkpoint asked for, if its answer came (without waiting for it).
    pub fn take_checkpoint(&mut self) -> Result<Option<HashCheckpoint>, HashError> {
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
    pub async fn wait_checkpoint(&mut self) -> Result<HashCheckpoint, HashError> {
        loop {
            if let Some(checkpoint) = self.checkpoint.take() {
                self.checkpoint_asked = false;
                return Ok(checkpoint);
            }
            let message = self.next().await?;
            self.accept_unasked(message)?;
        }
    }

    /// The SHA-256 of everything sent since the last reset.
    pub async fn finish(&mut self) -> Result<[u8; 32], HashError> {
        self.send(&HashCommand::Finish, None)?;
        match self.reply().await? {
            HashReport::Digest { digest } => Ok(digest),
            other => {
                Err(HashError::Unexpected { reply: format!("{other:?}"), when: "where a digest was due" })
            }
        }
    }
}

impl Drop for HashWorker {
    fn drop(&mut self) {
        self.port.close();
    }
}

impl Localize for HashError {
    fn message(&self) -> Message {
        match self {
            HashError::Checkpoint(e) => e.message(),
            HashError::Protocol(e) => e.message(),
            HashError::Reported(e) => e.message(),
            HashError::Stopped => Message::new("errHashStopped", []),
            HashError::Silent { seconds } => Message::new("errHashSilent", [arg(seconds)]),
            // Between our own workers: a bug, said as it is.
            HashError::NoData
            | HashError::NoBuffer
            | HashError::Unasked { .. }
            | HashError::Unexpected { .. } => Message::text(self),
        }
    }
}
