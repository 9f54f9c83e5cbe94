// Stock kafkajs driven by the tests (tests/kafka/kafkajs.py): reads a JSON plan on stdin,
// runs its steps in order against one broker and prints one JSON result per step, as a
// JSON list on stdout. Keys and values travel as hex (any bytes).
//
// Steps:
//   {"produce": {"topic", "codec": "none"|"gzip"|..., "messages": [{"key", "value"}],
//                "partition"?}}
//       -> {"offsets": [[partition, base offset], ...]} (one per send response)
//   {"consume": {"topic", "group", "count", "timeout_ms"?}}
//       a consumer in group "group" subscribed from the beginning reads until "count"
//       messages arrived (or a crash, or the timeout), then leaves the group
//       -> {"messages": [{"partition", "offset", "key", "value", "timestamp"}],
//           "error": null | "the crash's message", "committed": [[partition, offset]]}
"use strict";

const { Kafka, CompressionTypes, logLevel } = require("kafkajs");

const CODECS = {
  none: CompressionTypes.None, gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy, lz4: CompressionTypes.LZ4, zstd: CompressionTypes.ZSTD,
};

const hex = (buffer) => (buffer === null ? null : buffer.toString("hex"));
const bytes = (text) => (text === null || text === undefined ? null : Buffer.from(text, "hex"));

async function produce(kafka, step) {
  const producer = kafka.producer({ allowAutoTopicCreation: true });
  await producer.connect();
  try {
    const sent = await producer.send({
      topic: step.topic, compression: CODECS[step.codec], acks: -1,
      messages: step.messages.map((m) => ({
        key: bytes(m.key), value: bytes(m.value), partition: step.partition ?? 0,
      })),
    });
    return { offsets: sent.map((r) => [r.partition, Number(r.baseOffset)]) };
  } finally {
    await producer.disconnect();
  }
}

async function consume(kafka, step) {
  const consumer = kafka.consumer({
    groupId: step.group, sessionTimeout: 10000, heartbeatInterval: 500,
    retry: { retries: 0 },
  });
  const messages = [];
  let error = null;
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  consumer.on(consumer.events.CRASH, (event) => {
    error = String(event.payload.error && event.payload.error.message);
    finish();
  });
  const timer = setTimeout(finish, step.timeout_ms ?? 10000);
  await consumer.connect();
  await consumer.subscribe({ topic: step.topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ partition, message }) => {
      messages.push({
        partition, offset: Number(message.offset), key: hex(message.key),
        value: hex(message.value), timestamp: Number(message.timestamp),
      });
      if (messages.length >= step.count) finish();
    },
  });
  await done;
  clearTimeout(timer);
  await consumer.disconnect(); // commits what was read
  const admin = kafka.admin();
  await admin.connect();
  try {
    const [topic] = await admin.fetchOffsets({ groupId: step.group, topics: [step.topic] });
    const committed = topic.partitions.map((p) => [p.partition, Number(p.offset)]);
    return { messages, error, committed };
  } finally {
    await admin.disconnect();
  }
}

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const plan = JSON.parse(input);
  const kafka = new Kafka({
    clientId: "figtank-tests", brokers: [plan.broker], logLevel: logLevel.NOTHING,
    connectionTimeout: 3000, requestTimeout: 10000, retry: { retries: 2 },
  });
  const results = [];
  for (const step of plan.steps) {
    if (step.produce) results.push(await produce(kafka, step.produce));
    else if (step.consume) results.push(await consume(kafka, step.consume));
    else throw new Error(`unknown step ${JSON.stringify(step)}`);
  }
  process.stdout.write(JSON.stringify(results));
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
