//! The schema registry, when one is configured: output schemas registered
//! at start (their ids frame every record the processor writes), and the
//! verdict on each schema id met in framed input, asked once per id.

use std::collections::HashMap;
use std::sync::Arc;

use readfold_core::fold::InputKind;
use readfold_registry::Registry;
use readfold_wire::codec::WireFormat;
use readfold_wire::confluent::{self, Framing};
use readfold_wire::OutputTopics;

use crate::error::Result;
use crate::retrying;

/// What the registry says of a framed input record's schema id.
pub(crate) enum SchemaCheck {
    /// Not framed (plain Avro), or framed with an accepted schema.
    Accepted,
    /// Framed with a schema readfold does not read that topic with.
    Refused(String),
    /// Not asked yet.
    Unknown(u32),
}

/// The input schema ids seen so far and what the registry said of them.
pub(crate) struct InputSchemas {
    registry: Registry,
    verdicts: HashMap<(InputKind, u32), Result<(), String>>,
}

impl InputSchemas {
    pub(crate) fn new(registry: Registry) -> Self {
        InputSchemas {
            registry,
            verdicts: HashMap::new(),
        }
    }

    pub(crate) fn check(&self, kind: InputKind, value: Option<&[u8]>, format: WireFormat) -> SchemaCheck {
        let framed = match (format, value.and_then(confluent::unframe)) {
            (WireFormat::Plain, _) | (_, None) => return SchemaCheck::Accepted,
            (_, Some((id, _))) => id,
        };
        match self.verdicts.get(&(kind, framed)) {
            Some(Ok(())) => SchemaCheck::Accepted,
            Some(Err(why)) => SchemaCheck::Refused(why.clone()),
            None => SchemaCheck::Unknown(framed),
        }
    }

    /// Asks the registry about `id`, until it answers (an unreachable
    /// registry holds the input back rather than dead-lettering good
    /// records).
    pub(crate) async fn learn(&mut self, kind: InputKind, id: u32) -> Result<()> {
        let registry = &self.registry;
        let schema = retrying(
            || registry.schema(id),
            |e, delay| {
                tracing::warn!(id, error = %e, retry_in_ms = delay.as_millis() as u64, "cannot look a schema id up; retrying");
            },
        )
        .await?;
        let verdict = match schema {
            None => Err(format!(
                "schema id {id} is not in the registry {}",
                self.registry.url()
            )),
            Some(text) => {
                confluent::accepts_input_schema(kind, &text).map_err(|why| format!("schema id {id}: {why}"))
            }
        };
        tracing::info!(
            id,
            ?kind,
            accepted = verdict.is_ok(),
            "input schema id checked against the registry"
        );
        self.verdicts.insert((kind, id), verdict);
        Ok(())
    }
}

/// Registers every output schema under its subject and returns the ids to
/// frame the output with; waits for a registry that cannot be reached.
pub(crate) async fn register_outputs(registry: &Registry, out: &OutputTopics) -> Result<Arc<Framing>> {
    let mut ids = HashMap::new();
    for (subject, schema) in confluent::output_subjects(out) {
        let id = retrying(
            || registry.register(&subject, schema),
            |e, delay| {
                tracing::warn!(%subject, error = %e, retry_in_ms = delay.as_millis() as u64, "cannot register a schema; retrying");
            },
        )
        .await?;
        tracing::info!(%subject, id, "output schema registered");
        ids.insert(subject, id);
    }
    let framing = Framing::new(out, &ids).expect("every output subject was registered");
    Ok(Arc::new(framing))
}
