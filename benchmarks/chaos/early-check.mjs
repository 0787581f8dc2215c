// The checker over a partial history, off the coordinator's event loop (every proxy runs on
// it): run.mjs --stop-at-violation posts the history so far, and hears back the first
// violation of the invariants it names, or null.

import { parentPort } from 'node:worker_threads';
import { check } from './checker.mjs';

parentPort.on('message', ({ history, run, invariants }) => {
  const first = check(history, run).violations.find((v) => invariants.includes(v.invariant));
  parentPort.postMessage(first ? { invariant: first.invariant, detail: first.detail } : null);
});
