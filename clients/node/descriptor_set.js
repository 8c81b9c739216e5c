// The FileDescriptorSet registerType sends for a type of a protobufjs Root, built as protoc builds one
// from the .proto files: each file in its own syntax (proto2 or proto3: presence, required fields,
// defaults, closed enums and packing as the file has them), the oneofs of proto3 `optional` fields after
// the real ones, extensions as extensions. The sidecar tells two registrations of a file apart by what
// they define, so a file registered from here is then the same one protoc (the Python clients) would
// register. Built with protobufjs's descriptor extension (a dependency of @grpc/proto-loader).
'use strict';

const protobuf = require('protobufjs');
const descriptor = require('protobufjs/ext/descriptor');

// google.protobuf's well-known types are built into the sidecar: a file using
// one imports the sidecar's own file for it, by its usual name.
const WELL_KNOWN_FILES = {
  Any: 'any', Duration: 'duration', Empty: 'empty', FieldMask: 'field_mask', Struct: 'struct', Value: 'struct',
  ListValue: 'struct', NullValue: 'struct', Timestamp: 'timestamp', DoubleValue: 'wrappers', FloatValue: 'wrappers',
  Int64Value: 'wrappers', UInt64Value: 'wrappers', Int32Value: 'wrappers', UInt32Value: 'wrappers',
  BoolValue: 'wrappers', StringValue: 'wrappers', BytesValue: 'wrappers',
};

const TYPES = descriptor.FieldDescriptorProto.Type;
const LABEL_OPTIONAL = 1;
const LABEL_REQUIRED = 2;
const LABEL_REPEATED = 3;
// A message's extension and reserved ranges end past their last number in a descriptor; protobufjs keeps
// that number (an enum's reserved ranges end on it in both).
const exclusiveRanges = (ranges) => ranges.map(([start, end]) => ({ start, end: end + 1 }));

// A map field's entry type as protoc names it: my_map -> MyMapEntry.
function mapEntryName(fieldName) {
  const camel = fieldName.replace(/_+([a-z0-9])/g, (_, c) => c.toUpperCase());
  return `${camel.charAt(0).toUpperCase()}${camel.slice(1)}Entry`;
}

// The syntax of the .proto file `obj` came from: protobufjs's parser records it on the file's top-level
// objects ("proto2", "proto3" or an edition); a Root built in code has protobufjs's default for each.
function syntaxOf(obj) {
  let top = obj;
  while (top.parent instanceof protobuf.Type) top = top.parent;
  const syntax = top._edition || 'proto2';
  if (syntax !== 'proto2' && syntax !== 'proto3') {
    throw new Error(
      `registerType takes proto2 and proto3 files: ${top.fullName.slice(1)} is from an edition ${syntax} file;` +
        " register its type from protoc's descriptor set (the Python client's register_type)",
    );
  }
  return syntax;
}

// Options as the descriptor's options message holds them (custom options left out), or undefined when
// none is set: protoc leaves an options message out unless something is set in it.
function optionsOf(options, type) {
  const known = {};
  for (const [key, value] of Object.entries(options || {})) {
    const name = protobuf.util.camelCase(key);
    if (Object.prototype.hasOwnProperty.call(type.fields, name) && !type.fields[name].resolvedType) known[name] = value;
  }
  return Object.keys(known).length === 0 ? undefined : type.fromObject(known);
}

// C's %g with `precision` significant digits, as protoc's SimpleDtoa and SimpleFtoa print a default.
function formatG(value, precision) {
  const [mantissa, exp] = value.toExponential(precision - 1).split('e');
  const exponent = Number(exp);
  const strip = (s) => (s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s);
  if (exponent < -4 || exponent >= precision) {
    return `${strip(mantissa)}e${exponent < 0 ? '-' : '+'}${String(Math.abs(exponent)).padStart(2, '0')}`;
  }
  return strip(value.toFixed(precision - 1 - exponent));
}

// protoc's escaping of a bytes default: C escapes, other unprintable bytes in octal.
function cEscape(bytes) {
  const named = { 0x0a: '\\n', 0x0d: '\\r', 0x09: '\\t', 0x22: '\\"', 0x27: "\\'", 0x5c: '\\\\' };
  let out = '';
  for (const b of bytes) {
    if (named[b]) out += named[b];
    else if (b < 0x20 || b >= 0x7f) out += `\\${b.toString(8).padStart(3, '0')}`;
    else out += String.fromCharCode(b);
  }
  return out;
}

// A proto2 field's [default = ...] as protoc writes it in default_value.
function defaultValueOf(field, value) {
  if (field.resolvedType instanceof protobuf.Enum) {
    return typeof value === 'number' ? field.resolvedType.valuesById[value] : String(value);
  }
  if (field.type === 'double' || field.type === 'float') {
    const v = Number(value);
    if (Number.isNaN(v)) return 'nan';
    if (!Number.isFinite(v)) return v > 0 ? 'inf' : '-inf';
    if (Object.is(v, -0)) return '-0';
    // The shortest of two precisions that reads back as the same double, or float.
    const [round, short, long] = field.type === 'float' ? [Math.fround, 6, 9] : [Number, 15, 17];
    const shortest = formatG(round(v), short);
    return round(Number(shortest)) === round(v) ? shortest : formatG(round(v), long);
  }
  if (field.type === 'bytes') return cEscape(Buffer.from(String(value), 'utf8'));
  return String(value);
}

// A type's descriptor number and, for a message or an enum, its full name.
function typeOf(typeName, resolvedType, delimited) {
  if (resolvedType instanceof protobuf.Enum) return { type: TYPES.TYPE_ENUM, typeName: resolvedType.fullName };
  if (resolvedType instanceof protobuf.Type) {
    return { type: delimited ? TYPES.TYPE_GROUP : TYPES.TYPE_MESSAGE, typeName: resolvedType.fullName };
  }
  return { type: TYPES[`TYPE_${typeName.toUpperCase()}`] };
}

function fieldDescriptor(field, syntax, oneofs = []) {
  const f = { name: field.name, number: field.id };
  if (field instanceof protobuf.MapField) {
    Object.assign(f, { label: LABEL_REPEATED, type: TYPES.TYPE_MESSAGE });
    f.typeName = `${field.parent.fullName}.${mapEntryName(field.name)}`;
  } else {
    Object.assign(f, typeOf(field.type, field.resolvedType, field.delimited));
    f.label = field.repeated ? LABEL_REPEATED : field.required && syntax === 'proto2' ? LABEL_REQUIRED : LABEL_OPTIONAL;
  }
  if (field.extensionField) f.extendee = field.extensionField.parent.fullName;
  const options = field.options || {};
  if (options.default !== undefined && options.default !== null) f.defaultValue = defaultValueOf(field, options.default);
  if (field.partOf) f.oneofIndex = oneofs.indexOf(field.partOf);
  if (options.proto3_optional) f.proto3Optional = true;
  const fieldOptions = optionsOf(options, descriptor.FieldOptions); // `packed` as written, as protoc keeps it
  if (fieldOptions) f.options = fieldOptions;
  return f;
}

// A map field's entry type, as protoc generates it where the field is.
function mapEntry(field) {
  const value = typeOf(field.type, field.resolvedType, false);
  return {
    name: mapEntryName(field.name),
    field: [
      { name: 'key', number: 1, label: LABEL_OPTIONAL, ...typeOf(field.keyType, null, false) },
      { name: 'value', number: 2, label: LABEL_OPTIONAL, ...value },
    ],
    options: { mapEntry: true },
  };
}

const isSynthetic = (oneof) =>
  oneof.fieldsArray.length === 1 && Boolean(oneof.fieldsArray[0].options && oneof.fieldsArray[0].options.proto3_optional);

// A message's descriptor in protoc's shape: type names fully qualified, map entries named <Field>Entry,
// the oneofs of proto3 `optional` fields after all the others (in their fields' order), extensions
// declared within it in `extension` and not among its fields, inclusive ranges made exclusive.
function messageDescriptor(type, syntax) {
  // The extensions of this type declared elsewhere are among its fields under their full names.
  const fields = type.fieldsArray.filter((field) => !field.declaringField);
  const synthetic = fields.filter((field) => field.partOf && isSynthetic(field.partOf)).map((field) => field.partOf);
  const oneofs = [...type.oneofsArray.filter((oneof) => !synthetic.includes(oneof)), ...synthetic];
  const message = { name: type.name, field: [], nestedType: [], enumType: [], extension: [] };
  const ranges = (type.reserved || []).filter((r) => typeof r !== 'string');
  Object.assign(message, {
    oneofDecl: oneofs.map((oneof) => ({ name: oneof.name })),
    extensionRange: exclusiveRanges(type.extensions || []),
    reservedRange: exclusiveRanges(ranges),
    reservedName: (type.reserved || []).filter((r) => typeof r === 'string'),
    options: optionsOf(type.options, descriptor.MessageOptions),
  });
  const generated = [];
  for (const field of fields) {
    message.field.push(fieldDescriptor(field, syntax, oneofs));
    if (field instanceof protobuf.MapField) generated.push(mapEntry(field));
    else if (field.delimited && field.resolvedType && field.resolvedType.parent === type && field.resolvedType.group) {
      generated.push(field.resolvedType);
    }
  }
  const explicit = [];
  for (const nested of type.nestedArray) {
    if (nested instanceof protobuf.Type && !generated.includes(nested)) explicit.push(messageDescriptor(nested, syntax));
    else if (nested instanceof protobuf.Enum) message.enumType.push(enumDescriptor(nested));
    else if (nested instanceof protobuf.Field) message.extension.push(fieldDescriptor(nested, syntax));
  }
  // protoc keeps the order of declaration, which protobufjs does not record between a message's fields
  // and its nested types: those declared first, then map entries and groups in their fields' order.
  const fromFields = generated.map((g) => (g instanceof protobuf.Type ? messageDescriptor(g, syntax) : g));
  message.nestedType = [...explicit, ...fromFields];
  if (message.options === undefined) delete message.options;
  return message;
}

function enumDescriptor(enm) {
  const reserved = enm.reserved || [];
  const out = {
    name: enm.name,
    value: Object.entries(enm.values).map(([name, number]) => {
      const options = optionsOf(enm.valuesOptions && enm.valuesOptions[name], descriptor.EnumValueOptions);
      return options ? { name, number, options } : { name, number };
    }),
    reservedRange: reserved.filter((r) => typeof r !== 'string').map(([start, end]) => ({ start, end })),
    reservedName: reserved.filter((r) => typeof r === 'string'),
  };
  const options = optionsOf(enm.options, descriptor.EnumOptions);
  if (options) out.options = options;
  return out;
}

// The serialized FileDescriptorSet RegisterType takes for `typeName` of a protobufjs Root: one file per
// package the type reaches (named after the package: acme.agent.v1 -> acme/agent/v1.proto, or
// `fileName` for the type's own package), holding every message, enum and extension of that package,
// in the syntax of the .proto file they came from, and importing the files of the others it uses.
function descriptorSet(root, typeName, fileName) {
  root.resolveAll();
  const packageOf = (obj) => {
    let ns = obj.parent;
    while (ns instanceof protobuf.Type) ns = ns.parent;
    return ns;
  };
  const typePackage = packageOf(root.lookupType(typeName));
  const nameOf = (ns) =>
    ns === typePackage && fileName ? fileName : `${ns.fullName.slice(1).replace(/\./g, '/') || 'root'}.proto`;
  const files = new Map();
  const add = (ns) => {
    if (files.has(ns)) return;
    const pkg = ns.fullName.slice(1);
    const file = { name: nameOf(ns), package: pkg, messageType: [], enumType: [], extension: [] };
    files.set(ns, file);
    const imports = new Set();
    const use = (used) => {
      if (!used) return;
      const usedPackage = packageOf(used);
      if (usedPackage.fullName === '.google.protobuf') {
        let top = used;
        while (top.parent instanceof protobuf.Type) top = top.parent;
        imports.add(`google/protobuf/${WELL_KNOWN_FILES[top.name] || top.name.toLowerCase()}.proto`);
      } else if (usedPackage !== ns) {
        imports.add(nameOf(usedPackage));
        add(usedPackage);
      }
    };
    const usesOfField = (field) => {
      use(field.resolvedType);
      if (field.extensionField) use(field.extensionField.parent);
    };
    const uses = (type) => {
      for (const field of type.fieldsArray) if (!field.declaringField) usesOfField(field);
      for (const nested of type.nestedArray) {
        if (nested instanceof protobuf.Type) uses(nested);
        else if (nested instanceof protobuf.Field) usesOfField(nested);
      }
    };
    const syntaxes = new Set();
    for (const nested of ns.nestedArray) {
      if (nested instanceof protobuf.Type) {
        syntaxes.add(syntaxOf(nested));
        file.messageType.push(messageDescriptor(nested, syntaxOf(nested)));
        uses(nested);
      } else if (nested instanceof protobuf.Enum) {
        syntaxes.add(syntaxOf(nested));
        file.enumType.push(enumDescriptor(nested));
      } else if (nested instanceof protobuf.Field) {
        syntaxes.add(syntaxOf(nested));
        file.extension.push(fieldDescriptor(nested, syntaxOf(nested)));
        usesOfField(nested);
      }
    }
    if (syntaxes.size > 1) {
      throw new Error(
        `registerType makes one file of package ${pkg || '(none)'}, whose types come from ${[...syntaxes].join(' and ')}` +
          ' files: give each syntax a package of its own',
      );
    }
    // protoc leaves a proto2 file's syntax unset.
    if (!syntaxes.has('proto2')) file.syntax = 'proto3';
    file.dependency = [...imports];
  };
  add(typePackage);
  return Buffer.from(descriptor.FileDescriptorSet.encode({ file: [...files.values()] }).finish());
}

module.exports = { descriptorSet, mapEntryName };
