// The widget module's name and version, as the kernel names them (tfgpu_magic/widget.py
// SideArea: _model_module, _model_module_version "^0.1.0").  tests/test_labextension.py keeps
// them equal to package.json and to the Python package's version.
export const MODULE_NAME = 'tfgpu-magic';
export const MODULE_VERSION = '0.1.0';
