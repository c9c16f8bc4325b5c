//! One simulated agent: its stream to the controller, the batches it sends and the acks it
//! reads.

use super::*;

type Opened = (
    Channel,
    mpsc::Sender<FlowBatch>,
    tonic::Streaming<uplink::BatchAck>,
);

/// Dials the controller (own TCP + TLS connection) and opens the agent's stream; returns once the
/// controller has authenticated it (it answers the stream's headers after the TokenReview).
pub(super) async fn open(endpoint: &str, ca: Certificate, agent: &AgentSpec) -> Result<Opened> {
    let channel = Endpoint::from_shared(endpoint.to_string())?
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(ca)
                .domain_name(SERVER_NAME),
        )?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .context("connecting")?;
    let (tx, rx) = mpsc::channel::<FlowBatch>(2);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {}", agent.token).parse()?);
    let acks = FlowUplinkClient::new(channel.clone())
        .max_decoding_message_size(8 * 1024 * 1024)
        .stream(request)
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok((channel, tx, acks))
}

/// One simulated agent: a batch every `interval` until the window is over, then its last acks.
#[allow(clippy::too_many_arguments)]
pub(super) async fn agent_loop(
    node: String,
    mut mix: Mix,
    tx: mpsc::Sender<FlowBatch>,
    mut acks: tonic::Streaming<uplink::BatchAck>,
    window: Arc<Window>,
    interval: Duration,
    offset: Duration,
    per_batch: usize,
    (new_edge_every, new_edge_turn): (u64, u64),
) -> AgentOutcome {
    let mut out = AgentOutcome::default();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sequence = 0u64;
    // Sent batches waiting for their ack: sequence, send time, inside the window.
    let mut inflight: VecDeque<(u64, Instant, bool)> = VecDeque::new();
    let mut sending = Some(tx);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick(), if sending.is_some() => {
                let now = Instant::now();
                if window.over(now) {
                    // Closing our side ends the stream once the controller has acked the rest.
                    sending = None;
                    deadline = Some(tokio::time::Instant::now() + Duration::from_secs(8));
                    if inflight.is_empty() {
                        break;
                    }
                    continue;
                }
                let in_window = window.contains(now);
                sequence += 1;
                let new_edge = new_edge_every > 0
                    && (sequence + new_edge_turn).is_multiple_of(new_edge_every);
                let batch = FlowBatch {
                    sequence,
                    node: node.clone(),
                    records: mix.records(per_batch, new_edge),
                    instance: 1,
                    // As a real agent's: what it lost so far (nothing).
                    health: Some(Default::default()),
                };
                if in_window {
                    out.offered_in_window += per_batch as u64;
                }
                match sending.as_ref().expect("sending").try_send(batch) {
                    Ok(()) => {
                        inflight.push_back((sequence, now, in_window));
                        out.sent_in_window += u64::from(in_window);
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => out.skipped += 1,
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
            message = acks.message() => match message {
                Ok(Some(ack)) => {
                    let now = Instant::now();
                    // An acknowledgement names one batch, and they may come out of order: a batch
                    // that teaches nothing new goes before an earlier one waiting for its write.
                    let acked = inflight.iter().position(|&(seq, _, _)| seq == ack.sequence);
                    if let Some((_, sent, in_window)) = acked.and_then(|i| inflight.remove(i)) {
                        if in_window {
                            out.latencies.push(now - sent);
                            out.accepted_in_window += u64::from(ack.accepted);
                        }
                    }
                    out.rejected += u64::from(ack.rejected);
                    if ack.rejected > 0 && out.error.is_none() {
                        out.error = Some(format!("rejected records: {}", ack.reason));
                    }
                    if sending.is_none() && inflight.is_empty() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    out.error = Some(format!("{:?}: {}", status.code(), status.message()));
                    break;
                }
            },
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => break,
        }
    }
    // Never acknowledged: counted, and in the latency samples as at least the time waited.
    let now = Instant::now();
    for (_, sent, in_window) in inflight {
        if in_window {
            out.unacked += 1;
            out.latencies.push(now - sent);
        }
    }
    out
}
