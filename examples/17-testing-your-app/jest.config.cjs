// Jest against a throwaway Redis: `npx jest --config examples/17-testing-your-app/jest.config.cjs`
module.exports = {
  rootDir: __dirname,
  testMatch: ['<rootDir>/*.jest.cjs'],
  testEnvironment: 'node',
  transform: {}, // plain CommonJS; Node 24 runs `await using` itself
  globalSetup: '<rootDir>/jest.global-setup.mjs',
  globalTeardown: '<rootDir>/jest.global-teardown.mjs',
}
