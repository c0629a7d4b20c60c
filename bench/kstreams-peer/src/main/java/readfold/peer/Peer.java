package readfold.peer;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * readfold's max-fold of read reports, written as a Kafka Streams user would:
 * the Processor API on the input as it is partitioned (by conversation, so no
 * repartition topic), EOS v2, one stream thread. Each READ report that is not
 * private raises (conversation, user)'s cursor to max(old, seq) in a logged
 * RocksDB store; keys raised since the last emit are kept in a second logged
 * store (in memory, restored from its changelog), and a wall-clock punctuation every commit interval emits each one's
 * cursor once, as a CursorUpdate keyed like readfold's two changelogs.
 *
 * It does less than readfold: no conversation events (membership, join
 * seqs, latest seq), no private cursors, no unread marks, no dead letters.
 */
public final class Peer {
    static final String CURSORS = "cursors";
    static final String CHANGED = "changed";

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = parse(args);
        Schema report = new Schema.Parser().parse(new File(opts.get("schemas"), "ReadReport.avsc"));
        long commitMs = Long.parseLong(opts.getOrDefault("commit-interval-ms", "100"));

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, opts.get("application-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, opts.get("bootstrap"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.STATE_DIR_CONFIG, opts.get("state-dir"));
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        Topology topology = new Topology();
        topology.addSource("reports", new ByteArrayDeserializer(), new ByteArrayDeserializer(), opts.get("reports"));
        topology.addProcessor("fold", () -> new MaxFold(report, commitMs), "reports");
        topology.addStateStore(
                // Cached as the DSL's stores are (the Processor API's are not
                // by default): RocksDB and the changelog see each key once
                // per commit, not once per report.
                Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(CURSORS), Serdes.Bytes(), Serdes.Long())
                        .withCachingEnabled(),
                "fold");
        topology.addStateStore(
                // In memory but logged (restored from its changelog after a
                // crash): a set that is emptied on every punctuation would
                // leave RocksDB iterating over its own tombstones.
                Stores.keyValueStoreBuilder(Stores.inMemoryKeyValueStore(CHANGED), Serdes.Bytes(), Serdes.Long())
                        .withCachingEnabled(),
                "fold");
        topology.addSink("by-conversation", opts.get("by-conversation"), new ByteArraySerializer(),
                new ByteArraySerializer(), "fold");
        topology.addSink("by-user", opts.get("by-user"), new ByteArraySerializer(), new ByteArraySerializer(),
                "fold");

        KafkaStreams streams = new KafkaStreams(topology, p);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            stopped.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                    .SHUTDOWN_CLIENT;
        });
        streams.start();
        stopped.await();
    }

    static Map<String, String> parse(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : List.of("bootstrap", "reports", "by-conversation", "by-user", "application-id",
                "state-dir", "schemas")) {
            if (!opts.containsKey(required)) {
                throw new IllegalArgumentException("missing --" + required);
            }
        }
        return opts;
    }

    /** The fold: max-merge per (conversation, user), emit what changed. */
    static final class MaxFold implements Processor<byte[], byte[], byte[], byte[]> {
        private final GenericDatumReader<GenericRecord> reader;
        private final long commitMs;
        private ProcessorContext<byte[], byte[]> context;
        private KeyValueStore<Bytes, Long> cursors;
        private KeyValueStore<Bytes, Long> changed;
        private BinaryDecoder decoder;
        private GenericRecord reuse;
        private BinaryEncoder encoder;
        private final ByteArrayOutputStream out = new ByteArrayOutputStream(128);
        private long malformed;

        MaxFold(Schema report, long commitMs) {
            this.reader = new GenericDatumReader<>(report);
            this.commitMs = commitMs;
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.context = context;
            this.cursors = context.getStateStore(CURSORS);
            this.changed = context.getStateStore(CHANGED);
            context.schedule(Duration.ofMillis(commitMs), PunctuationType.WALL_CLOCK_TIME, this::emit);
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            byte[] value = record.value();
            if (value == null || value.length == 0) {
                malformed++;
                return;
            }
            // Confluent framing: magic 0 and a 4-byte schema id.
            int offset = value[0] == 0 && value.length > 5 ? 5 : 0;
            try {
                decoder = DecoderFactory.get().binaryDecoder(value, offset, value.length - offset, decoder);
                reuse = reader.read(reuse, decoder);
            } catch (IOException | RuntimeException e) {
                malformed++;
                return;
            }
            if (Boolean.TRUE.equals(reuse.get("private")) || !"READ".equals(reuse.get("action").toString())) {
                return;
            }
            long seq = (Long) reuse.get("seq");
            Bytes key = Bytes.wrap(cursorKey(reuse.get("conversation_id").toString(), reuse.get("user_id").toString()));
            Long old = cursors.get(key);
            if (old == null || seq > old) {
                cursors.put(key, seq);
                changed.put(key, seq);
            }
        }

        /** Emits every key raised since the last emit, once, and forgets it. */
        private void emit(long now) {
            List<KeyValue<Bytes, Long>> due = new ArrayList<>();
            try (KeyValueIterator<Bytes, Long> it = changed.all()) {
                it.forEachRemaining(due::add);
            }
            for (KeyValue<Bytes, Long> kv : due) {
                byte[] key = kv.key.get();
                byte[] update = cursorUpdate(key, kv.value, now);
                context.forward(new Record<>(key, update, now), "by-conversation");
                context.forward(new Record<>(userKey(key), update, now), "by-user");
                changed.delete(kv.key);
            }
        }

        /** Avro CursorKey: conversation_id, user_id. */
        private byte[] cursorKey(String conversation, String user) {
            out.reset();
            encoder = EncoderFactory.get().directBinaryEncoder(out, encoder);
            try {
                encoder.writeString(conversation);
                encoder.writeString(user);
                encoder.flush();
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
            return out.toByteArray();
        }

        /** Avro UserCursorKey: user_id, conversation_id, from a CursorKey. */
        private byte[] userKey(byte[] cursorKey) {
            BinaryDecoder d = DecoderFactory.get().binaryDecoder(cursorKey, null);
            try {
                String conversation = d.readString();
                String user = d.readString();
                return cursorKey(user, conversation);
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        }

        /**
         * Avro CursorUpdate: the key's two strings, cursor, join_seq (0: the
         * peer keeps no membership), latest_seq (the cursor: no events),
         * updated_at, and null private_cursor and unread_mark.
         */
        private byte[] cursorUpdate(byte[] key, long cursor, long now) {
            out.reset();
            out.writeBytes(key);
            encoder = EncoderFactory.get().directBinaryEncoder(out, encoder);
            try {
                encoder.writeLong(cursor);
                encoder.writeLong(0);
                encoder.writeLong(cursor);
                encoder.writeLong(now);
                encoder.writeIndex(0);
                encoder.writeIndex(0);
                encoder.flush();
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
            return out.toByteArray();
        }

        @Override
        public void close() {
            if (malformed > 0) {
                System.err.println("kstreams-peer: skipped " + malformed + " malformed reports");
            }
        }
    }
}
