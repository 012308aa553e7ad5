// ESLint over every front-end source (js/: the JupyterLab extension and the %gpu monitor panel):
// typescript-eslint's type-checked recommended rules, with the types tsconfig.check.json gives.
// `make lint-js` runs it after `tsc -p tsconfig.check.json`.
import js from "@eslint/js";
import { defineConfig } from "eslint/config";
import tseslint from "typescript-eslint";

export default defineConfig(
  { ignores: ["lib/", "node_modules/", "tfgpu_magic/", "build/", ".venv/", "test-artifacts/"] },
  {
    files: ["js/**/*.ts"],
    extends: [js.configs.recommended, tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: {
        project: ["./tsconfig.check.json"],
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      // `const { a, ...rest } = row` is how a row leaves out the keys it does not compare.
      "@typescript-eslint/no-unused-vars": ["error", { ignoreRestSiblings: true }],
    },
    linterOptions: { reportUnusedDisableDirectives: "error" },
  },
);
