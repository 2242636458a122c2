// The package's eslint (9, flat config), run by scripts/lint.sh: eslint's recommended rules and
// typescript-eslint's type-checked recommended rules over src/, with the types of tsconfig.json.
// No rule is turned off: an exception is one `eslint-disable-next-line` with its reason.
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'src/generated/', 'test/', 'scripts/', 'eslint.config.mjs'] },
  js.configs.recommended,
  tseslint.configs.recommendedTypeChecked,
  {
    files: ['src/**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: dirname(fileURLToPath(import.meta.url)) },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // A promise rejects with what a catch caught (`unknown`) as `throw error` rethrows it
      // (only-throw-error's own default); anything else it rejects with must be an Error.
      '@typescript-eslint/prefer-promise-reject-errors': ['error', { allowThrowingUnknown: true }],
    },
  },
);
