// The type a generated dashboard JSON must have: Grafana 11.6's dashboard model from @grafana/schema, with
// the query models of the two datasources tokwatch's dashboards use, which @grafana/schema does not define.
// tests/dashboards/test_grafana_schema.py writes each dashboard as `const d: DashboardJson = <JSON>` and
// compiles it with tsc --strict: a wrong type, an unknown enum value, a missing required field or a key the
// model does not define (excess property) is an error.
import type { AnnotationQuery, Dashboard, DataQuery, Panel, RowPanel } from "@grafana/schema";

// JSON has no TypeScript enums: a string enum is checked as the union of its values.
export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

// Grafana's Prometheus query model (grafana-foundation-sdk 11.6, `prometheus.dataquery`).
interface PrometheusQuery extends DataQuery {
  expr: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  editorMode?: "code" | "builder";
  format?: "time_series" | "table" | "heatmap";
  legendFormat?: string;
  intervalFactor?: number;
  interval?: string;
}

// Grafana's SQL query model (the PostgreSQL datasource's SQLQuery: raw SQL in the code editor).
interface SqlQuery extends DataQuery {
  rawSql: string;
  rawQuery?: boolean;
  format?: "table" | "time_series";
  editorMode?: "code" | "builder";
}

// Grafana's Prometheus plugin reads the query from `target` and these display fields from the annotation
// itself (its annotation support's processEvents).
interface PrometheusAnnotation extends AnnotationQuery<PrometheusQuery> {
  tagKeys?: string;
  titleFormat?: string;
  textFormat?: string;
  useValueForTime?: boolean;
}

type TypedPanel = Omit<Panel, "targets"> & { targets?: Array<PrometheusQuery | SqlQuery> };
type TypedRow = Omit<RowPanel, "panels"> & { panels: TypedPanel[] };
type TypedDashboard = Omit<Dashboard, "panels" | "annotations"> & {
  panels?: Array<TypedPanel | TypedRow>;
  annotations?: { list?: Array<AnnotationQuery | PrometheusAnnotation> };
};

export type DashboardJson = Json<TypedDashboard>;
