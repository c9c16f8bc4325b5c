//! The uplink task: numbered batches written to the stream, acknowledgements, reconnects.

use super::*;

/// Starts the uplink task. It runs until every [`UplinkSender`] is dropped and every batch has been
/// acknowledged; while the controller is unreachable it keeps retrying (abort the handle to stop it).
/// Fails only when the endpoint URL is unusable.
pub fn spawn(
    config: UplinkConfig,
    counters: UplinkCounters,
) -> Result<(UplinkSender, JoinHandle<()>), UplinkError> {
    // Checked now so a wrong flag fails the start; rebuilt at every connect (the CA file may rotate).
    endpoint(&config)?;
    let (queue, receiver) = mpsc::channel(config.queue_batches.max(1));
    let sender = UplinkSender {
        queue,
        counters: counters.clone(),
    };
    let task = Task {
        buffer: ResendBuffer::new(config.max_pending_batches)
            .with_max_records(config.max_pending_records),
        config,
        queue: receiver,
        queue_open: true,
        counters,
        waiting: VecDeque::new(),
    };
    Ok((sender, tokio::spawn(task.run())))
}

/// Sets the `connected` gauge back to 0 when the session ends.
struct Connected(Gauge);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

/// How many batches may be written ahead of the transport. Small: the resend buffer holds the rest.
const OUTBOUND_WINDOW: usize = 4;

impl Task {
    async fn run(mut self) {
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            let mut acknowledged = false;
            let error = match self.session(&mut acknowledged).await {
                Ok(()) => return,
                Err(error) => error,
            };
            if !self.queue_open && self.buffer.is_empty() {
                return;
            }
            // A stream that worked for a while was not part of the failures the backoff grows on.
            if acknowledged || started.elapsed() >= self.config.backoff.max {
                attempt = 0;
            }
            let delay = self.config.backoff.delay(attempt, jitter());
            attempt = attempt.saturating_add(1);
            tracing::warn!(
                %error,
                retry_in = ?delay,
                pending = self.buffer.len(),
                dropped = self.buffer.dropped(),
                "uplink to the controller interrupted"
            );
            // Keep taking batches while waiting, so the data path's queue does not fill up because the
            // controller is away: the resend buffer absorbs them, dropping its oldest when full.
            let wait = tokio::time::sleep(delay);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => break,
                    outgoing = self.queue.recv(), if self.queue_open => self.take(outgoing),
                }
            }
            self.counters.reconnects.inc();
        }
    }

    /// Moves records from the queue into the resend buffer as batches of at most
    /// `max_records_per_batch` (`None`: every sender is gone); their receipts wait for those batches.
    pub(super) fn take(&mut self, outgoing: Option<Outgoing>) {
        let Some(Outgoing {
            records,
            receipts,
            health,
        }) = outgoing
        else {
            self.queue_open = false;
            return;
        };
        let max = self.config.max_records_per_batch.max(1);
        let mut sequences = Vec::new();
        // Each batch its own vector of its records only: splitting off the rest instead left every
        // batch with the capacity of all that followed it, which the resend buffer held until
        // acknowledged (a spray's 40,000 records took about 50 MB where 11 MB is theirs).
        let mut records = records.into_iter();
        loop {
            let batch: Vec<FlowRecord> = records.by_ref().take(max).collect();
            if batch.is_empty() {
                break;
            }
            // The data path's counts, with the batches this uplink dropped so far.
            let health = health.map(|h| AgentHealth {
                batches_dropped: self.counters.batches_dropped.get(),
                ..h
            });
            let pushed = self
                .buffer
                .push_with_health(&self.config.node, batch, health);
            sequences.push(pushed.sequence);
            if !pushed.dropped.is_empty() {
                self.counters
                    .batches_dropped
                    .inc_by(pushed.dropped.len() as u64);
                tracing::debug!(
                    sequences = ?pushed.dropped,
                    "uplink buffer full: dropped the oldest batches"
                );
                pushed.dropped.iter().for_each(|s| self.settle(*s));
            }
        }
        // A batch of this very send may have made room for its successor.
        sequences.retain(|s| self.buffer.contains(*s));
        if sequences.is_empty() {
            receipts.into_iter().for_each(Receipt::settle);
        } else if !receipts.is_empty() {
            self.waiting.push_back(Waiting {
                sequences,
                receipts,
            });
        }
        self.counters.pending_batches.set(self.buffer.len() as i64);
    }

    /// Batch `sequence` is acknowledged or dropped: settles the receipts that waited only for it.
    fn settle(&mut self, sequence: u64) {
        for waiting in &mut self.waiting {
            waiting.sequences.retain(|s| *s != sequence);
        }
        while let Some(i) = self.waiting.iter().position(|w| w.sequences.is_empty()) {
            if let Some(done) = self.waiting.remove(i) {
                done.receipts.into_iter().for_each(Receipt::settle);
            }
        }
    }

    pub(super) fn acknowledge(&mut self, ack: &BatchAck) {
        if self.buffer.ack(ack.sequence) {
            self.counters.batches_acked.inc();
            self.settle(ack.sequence);
        }
        self.counters
            .records_accepted
            .inc_by(u64::from(ack.accepted));
        self.counters
            .records_rejected
            .inc_by(u64::from(ack.rejected));
        if ack.rejected > 0 {
            tracing::debug!(
                sequence = ack.sequence,
                rejected = ack.rejected,
                reason = %ack.reason,
                "the controller refused records"
            );
        }
        self.counters.pending_batches.set(self.buffer.len() as i64);
    }

    /// One stream: connect, resend what is unacknowledged, then send new batches and take acks until
    /// something fails. `Ok` only when every sender is gone and every batch acknowledged.
    async fn session(&mut self, acknowledged: &mut bool) -> Result<(), UplinkError> {
        let token = read_token(&self.config.token_file)?;
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| UplinkError::TokenHeader(self.config.token_file.clone()))?;
        let channel = connect(&self.config).await?;
        let mut client = FlowUplinkClient::new(channel);
        let (outbound, outbound_rx) = mpsc::channel::<FlowBatch>(OUTBOUND_WINDOW);
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound_rx));
        request.metadata_mut().insert("authorization", header);
        let mut acks = client
            .stream(request)
            .await
            .map_err(UplinkError::Refused)?
            .into_inner();
        tracing::info!(
            endpoint = %self.config.endpoint,
            pending = self.buffer.len(),
            "uplink connected"
        );
        self.counters.connected.set(1);
        // Back to 0 however the session ends.
        let _connected = Connected(self.counters.connected.clone());
        // Everything below `next` has been written to this stream. Starting at 0 resends every
        // unacknowledged batch: the previous stream may have died with them in flight.
        let mut next = 0u64;
        let pace = Duration::from_secs(1) / self.config.max_batches_per_second.max(1);
        let mut send_at = tokio::time::Instant::now();
        loop {
            if !self.queue_open && self.buffer.is_empty() {
                // Dropping `outbound` ends our half of the stream; the controller then ends its half.
                return Ok(());
            }
            let unsent = self.buffer.next_from(next).is_some();
            tokio::select! {
                // Reserve first, then pick the batch: whatever the buffer dropped meanwhile is skipped.
                permit = async {
                    tokio::time::sleep_until(send_at).await;
                    outbound.reserve().await
                }, if unsent => {
                    let permit = permit.map_err(|_| UplinkError::Ended)?;
                    if let Some(batch) = self.buffer.next_from(next) {
                        next = batch.sequence + 1;
                        permit.send(batch.clone());
                        self.counters.batches_sent.inc();
                        send_at = tokio::time::Instant::now() + pace;
                    }
                }
                outgoing = self.queue.recv(), if self.queue_open => self.take(outgoing),
                ack = acks.message() => match ack {
                    Ok(Some(ack)) => {
                        *acknowledged = true;
                        self.acknowledge(&ack);
                    }
                    Ok(None) => return Err(UplinkError::Ended),
                    Err(status) => return Err(UplinkError::Stream(status)),
                },
            }
        }
    }
}
