// The store side of fencing, in SQL: a write carries the lease's fence, and the store keeps
// it only if no write with a larger fence came first. One statement, so the check and the
// write cannot be split by another writer. Runs on Node's built-in SQLite (node:sqlite).
//
// The same statement elsewhere (fences fit a signed 64-bit integer: BIGINT):
//   PostgreSQL: INSERT INTO reports (id, body, fence) VALUES ($1, $2, $3)
//               ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, fence = EXCLUDED.fence
//               WHERE reports.fence < EXCLUDED.fence
//   MySQL:      UPDATE reports SET body = ?, fence = ? WHERE id = ? AND fence < ?
//               (after INSERT IGNORE of the row with fence 0; affectedRows 0 = refused)
import { DatabaseSync } from 'node:sqlite'

export function openReports(path = ':memory:') {
  const db = new DatabaseSync(path)
  db.exec('CREATE TABLE IF NOT EXISTS reports (id TEXT PRIMARY KEY, body TEXT NOT NULL, fence INTEGER NOT NULL)')
  const upsert = db.prepare(`
    INSERT INTO reports (id, body, fence) VALUES (?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence = excluded.fence
    WHERE reports.fence < excluded.fence`)
  const read = db.prepare('SELECT body, fence FROM reports WHERE id = ?')
  read.setReadBigInts(true)
  return {
    /** True when the write was kept; false when a write with this fence or a larger one came first. */
    write(id, body, fence) {
      // A fence is a decimal string: BigInt keeps every digit (a Number would round it).
      return upsert.run(id, body, BigInt(fence)).changes === 1
    },
    read(id) {
      const row = read.get(id)
      return row && { body: row.body, fence: String(row.fence) }
    },
    close: () => db.close(),
  }
}
