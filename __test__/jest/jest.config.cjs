// Jest, as an app's test suite would use the driver (`npm run test:jest`; run by
// __test__/packaging/jest.test.mjs inside `npm test`). Its own folder and testMatch keep it
// away from the node:test files; no transform: the tests are plain CommonJS.
'use strict'

module.exports = {
  rootDir: __dirname,
  testMatch: ['<rootDir>/*.jest.cjs'],
  testEnvironment: 'node',
  transform: {},
  globalSetup: '<rootDir>/global-setup.mjs',
  globalTeardown: '<rootDir>/global-teardown.mjs',
  testTimeout: 20_000,
}
