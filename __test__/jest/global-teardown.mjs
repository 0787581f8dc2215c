export default async function globalTeardown() {
  await globalThis.__DOKEBI_JEST_REDIS__?.stop()
}
