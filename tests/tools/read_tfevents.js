#!/usr/bin/env node
// An independent reader of TensorBoard event files, sharing no code with omnitron: the
// TFRecord framing is checked here with SheetJS's CRC-32C, and each record is decoded by
// protobuf.js from TensorFlow's published .proto definitions (the fields TensorBoard's
// scalar dashboard reads). Fetched by scripts/fetch_test_tools.sh.
//   node read_tfevents.js TOOLS_DIR EVENT_FILE
// Prints one JSON object per event: {"wall_time", "step", "file_version"} or
// {"wall_time", "step", "values": [{"tag", "simple_value"}]}. Exits 1 naming the record and
// byte offset on a bad CRC, a truncated record or an undecodable Event.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length !== 4) {
  console.error('usage: node read_tfevents.js TOOLS_DIR EVENT_FILE');
  process.exit(2);
}
const tools = process.argv[2];
const CRC32C = require(path.join(tools, 'crc32c.js'));
const protobuf = require(path.join(tools, 'protobuf.min.js'));

// tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto, the
// members a scalar event uses.
const schema = `
syntax = "proto3";
package tensorflow;
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what {
    string file_version = 3;
    bytes graph_def = 4;
    Summary summary = 5;
  }
}
message Summary {
  message Value {
    string node_name = 7;
    string tag = 1;
    oneof value {
      float simple_value = 2;
      bytes obsolete_old_style_histogram = 3;
    }
  }
  repeated Value value = 1;
}
`;
const Event = protobuf.parse(schema, { keepCase: true }).root.lookupType('tensorflow.Event');

// TFRecord's masked CRC (tensorflow/core/lib/hash/crc32c.h).
function masked(bytes) {
  const crc = CRC32C.buf(bytes) >>> 0;
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

function fail(message) {
  console.error(`read_tfevents: ${process.argv[3]}: ${message}`);
  process.exit(1);
}

const file = fs.readFileSync(process.argv[3]);
let offset = 0;
for (let record = 0; offset < file.length; ++record) {
  const where = `record ${record} at byte ${offset}`;
  if (offset + 12 > file.length) fail(`${where}: truncated header`);
  const lengthBytes = file.subarray(offset, offset + 8);
  if (masked(lengthBytes) !== file.readUInt32LE(offset + 8)) fail(`${where}: length CRC mismatch`);
  const length = Number(file.readBigUInt64LE(offset));
  const start = offset + 12;
  if (start + length + 4 > file.length) fail(`${where}: truncated data`);
  const data = file.subarray(start, start + length);
  if (masked(data) !== file.readUInt32LE(start + length)) fail(`${where}: data CRC mismatch`);
  let event;
  try {
    event = Event.toObject(Event.decode(data), { longs: Number, oneofs: true });
  } catch (e) {
    fail(`${where}: not an Event: ${e.message}`);
  }
  const out = { wall_time: event.wall_time, step: event.step || 0 };
  if (event.what === 'file_version') out.file_version = event.file_version;
  if (event.what === 'summary') {
    out.values = (event.summary.value || []).map((v) => ({ tag: v.tag, simple_value: v.simple_value }));
  }
  console.log(JSON.stringify(out));
  offset = start + length + 4;
}
