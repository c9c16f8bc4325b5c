//! Receipts: how a flow source learns that the records it handed over were acknowledged.

use super::*;

/// Travels with records to the uplink and is settled once the controller acknowledged every batch made
/// of them, or once they were dropped and counted (queue or resend buffer full: gone either way). A
/// receipt dropped unsettled (the uplink stopped first) is never settled: its source then keeps what it
/// would otherwise have forgotten, and reads it again after a restart.
#[derive(Debug)]
pub struct Receipt(Arc<AtomicBool>);

/// The source's side of a [`Receipt`].
#[derive(Clone, Debug)]
pub struct ReceiptWatch(Arc<AtomicBool>);

/// A new unsettled receipt and its watch.
pub fn receipt() -> (Receipt, ReceiptWatch) {
    let flag = Arc::new(AtomicBool::new(false));
    (Receipt(flag.clone()), ReceiptWatch(flag))
}

impl Receipt {
    /// Marks the records it travelled with as acknowledged (or dropped and counted).
    pub fn settle(self) {
        self.0.store(true, Ordering::Release);
    }
}

impl ReceiptWatch {
    /// Whether the receipt has been settled.
    pub fn settled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
