//! A stand-in for the controller's uplink endpoint, for tests of the agent's uplink: it records the
//! sequence numbers it reads and acknowledges them only when asked to (to lose acknowledgements on
//! purpose, which the real controller never does).

use network_enforcer_api::uplink::flow_uplink_server::{FlowUplink, FlowUplinkServer};
use network_enforcer_api::uplink::{BatchAck, FlowBatch};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tonic::Status;

/// Records each batch's sequence number in `seen`; acknowledges it (all records accepted) when `acks`.
pub struct Recorder {
    pub seen: Arc<Mutex<Vec<u64>>>,
    pub acks: bool,
}

#[tonic::async_trait]
impl FlowUplink for Recorder {
    type StreamStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<BatchAck, Status>> + Send>>;

    async fn stream(
        &self,
        request: tonic::Request<tonic::Streaming<FlowBatch>>,
    ) -> Result<tonic::Response<Self::StreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (seen, acks) = (self.seen.clone(), self.acks);
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(batch.sequence);
                let ack = BatchAck {
                    sequence: batch.sequence,
                    accepted: u32::try_from(batch.records.len()).unwrap_or(u32::MAX),
                    ..BatchAck::default()
                };
                if acks && tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Starts a [`Recorder`] on a loopback port (plaintext); returns its address and the sequences it read.
pub async fn serve_recorder(acks: bool) -> (SocketAddr, Arc<Mutex<Vec<u64>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port for the stand-in controller");
    let addr = listener.local_addr().expect("the listener's address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let service = FlowUplinkServer::new(Recorder {
        seen: seen.clone(),
        acks,
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, seen)
}
